"""A third party's estimator, installed from plugins/rlcore-example, is used by name like a built-in."""

import json
import os
import sys
import textwrap

from tests.conftest import REPO, run_rlcore
from tests.processes import run_process

# In a fresh process with only the temporary install directory added: find the estimator by name
# through the plugin manager, as the trainer does, and run it on a small batch.
SCRIPT = textwrap.dedent("""
    import json, torch
    from rlcore.algorithms import AdvantageInputs
    from rlcore.config.schema import AlgorithmConfig
    from rlcore.plugins.manager import PluginManager

    entry = PluginManager().registry("advantage_estimators").entry("example/median_baseline")
    batch = AdvantageInputs(
        token_level_rewards=torch.tensor([[0., 1.], [3., 0.], [0., 2.], [10., 0.], [5., 0.], [0., 4.], [0., 6.]]),
        response_mask=torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0], [1, 0], [1, 1], [1, 1]]),
        group_ids=torch.tensor([0, 0, 0, 0, 1, 1, 1]),
    )
    out = entry.value.compute(batch, AlgorithmConfig())
    print(json.dumps({"plugin": entry.provider.plugin, "needs_groups": entry.value.needs_groups,
                      "advantages": out.advantages.tolist()}))
""")


def test_example_estimator_is_listed_and_works_by_name(plugin_site):
    listed = run_rlcore("plugins", "--json", site=plugin_site)
    assert listed.returncode == 0, listed.stderr
    example = next(p for p in json.loads(listed.stdout)["plugins"] if p["name"] == "example")
    assert example["registered"]["advantage_estimators"] == ["example/median_baseline"]

    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    env["PYTHONPATH"] = str(plugin_site)
    result = run_process([sys.executable, "-c", SCRIPT], name="the example estimator in a fresh process", timeout=120,
                         env=env, cwd=str(REPO))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["plugin"] == "example" and out["needs_groups"] is True
    # group 0 scores 1, 3, 2, 10: median (2 + 3) / 2 = 2.5; group 1 scores 5, 4, 6: median 5.
    # The score sits at the last response token; padding (the second token of a 1-token row) is 0.
    assert out["advantages"] == [[-1.5, -1.5], [0.5, 0.0], [-0.5, -0.5], [7.5, 0.0], [0.0, 0.0],
                                 [-1.0, -1.0], [1.0, 1.0]]


def test_example_tool_is_listed_and_runs(plugin_site):
    listed = run_rlcore("plugins", "--json", site=plugin_site)
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    assert plugins["example"]["registered"]["tools"] == ["example/word_count"]
    assert plugins["rlcore.tools.plugin"]["registered"]["tools"] == ["calculator", "python"]
    script = ("import json\nfrom rlcore.plugins.manager import PluginManager\n"
              "tool = PluginManager().registry('tools').get('example/word_count')\n"
              "print(json.dumps([tool.execute({'text': 'three small words'}).text, tool.schema()['function']['name']]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    env["PYTHONPATH"] = str(plugin_site)
    result = run_process([sys.executable, "-c", script], name="the example tool", timeout=120, env=env, cwd=str(REPO))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["3", "example/word_count"]
