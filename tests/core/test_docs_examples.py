"""The plugin examples of README.md and docs/plugins.md work: each Python block is loaded as a plugin by
the real plugin manager, and what it registers does what the page says."""

from __future__ import annotations

import argparse
import re
import types
from pathlib import Path

import pytest
import torch

from rlcore.algorithms import AdvantageInputs
from rlcore.config import load_job
from rlcore.config.schema import ActorConfig, AlgorithmConfig
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager
from tests.conftest import REPO

PLUGIN_PAGE = REPO / "docs" / "plugins.md"


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown file that implement a hook."""
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [block for block in blocks if "@hookimpl" in block]


def load_block(source: str, name: str) -> PluginManager:
    """A plugin manager holding only the core and the block, loaded as an in-process plugin."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    manager = PluginManager(autoload=False, plugins={name: module})
    assert manager.failed == [], [f.error for f in manager.failed]
    return manager


def registered(manager: PluginManager, name: str) -> dict[str, list[str]]:
    return next(p.registered for p in manager.loaded if p.provider.plugin == name)


@pytest.fixture
def page_plugins(monkeypatch) -> dict[str, PluginManager]:
    """Every block of docs/plugins.md, loaded; the example package is importable as if installed."""
    monkeypatch.syspath_prepend(str(REPO / "plugins" / "rlcore-example"))
    return {f"block{i}": load_block(block, f"block{i}") for i, block in enumerate(python_blocks(PLUGIN_PAGE))}


def the(page_plugins: dict[str, PluginManager], kind: str, name: str):
    """The value a block of the page registered as ``kind``/``name``."""
    for block, manager in page_plugins.items():
        if name in registered(manager, block).get(kind, []):
            return manager.get(kind, name)
    raise AssertionError(f"no block of docs/plugins.md registers {kind} {name!r}")


def test_the_readme_plugin_scores_its_data_source():
    (block,) = python_blocks(REPO / "README.md")
    assert len(block.strip().splitlines()) <= 12, "the README's plugin example is meant to stay about 10 lines"
    manager = load_block(block, "readme_plugin")
    assert registered(manager, "readme_plugin") == {"reward_functions": ["my/dataset"]}
    score = manager.get("reward_functions", "my/dataset")
    assert score("my/dataset", "3 + 4 = 7", "7") == 1.0
    assert score("my/dataset", "3 + 4 = 8", "7") == 0.0


def test_every_block_of_the_plugin_page_registers_something(page_plugins):
    assert len(page_plugins) >= 9
    for block, manager in page_plugins.items():
        assert registered(manager, block), f"{block} of docs/plugins.md registered nothing"


def test_the_reward_example(page_plugins):
    score = the(page_plugins, "reward_functions", "my/dataset")
    assert score("my/dataset", "The answer is 12.", 12) == {"score": 1.0, "acc": 1.0}
    assert score("my/dataset", "The answer is 13.", 12) == {"score": 0.0, "acc": 0.0}
    assert the(page_plugins, "reward_functions", "example/target_length")("d", "a b c", "3") == 1.0


def test_the_advantage_estimator_example(page_plugins):
    estimator = the(page_plugins, "advantage_estimators", "my/loo_sign")
    assert estimator.needs_groups and not estimator.needs_critic
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])  # (B, T)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5])
    rewards = torch.zeros(4, 3)
    rewards[torch.arange(4), mask.sum(-1) - 1] = scores  # each score on its last response token
    inputs = AdvantageInputs(token_level_rewards=rewards, response_mask=mask, group_ids=torch.tensor([0, 0, 1, 1]))
    out = estimator.compute(inputs, AlgorithmConfig())
    # group 0: 1 is above 0, 0 below 1; group 1: equal scores give 0; padding stays 0
    expected = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(out.advantages, expected) and torch.equal(out.returns, expected)


def test_the_policy_loss_example(page_plugins):
    loss_fn = the(page_plugins, "policy_losses", "my/plain_pg")
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = loss_fn(log_prob.detach(), log_prob, advantages, mask, ActorConfig())
    # token-mean of -A log p over the 3 response tokens: (1 + 2 - 1) / 3
    assert out.loss.item() == pytest.approx(2 / 3)
    out.loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]]))
    assert set(out.metrics) == {"pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
    assert out.metrics["ppo_kl"] == 0.0


def test_the_kl_estimator_example(page_plugins):
    kl = the(page_plugins, "kl_estimators", "my/clamped_k1")
    values = kl(torch.tensor([0.0, -1.0, 10.0]), torch.tensor([-1.0, 0.0, 0.0]))
    assert torch.equal(values, torch.tensor([1.0, -1.0, 5.0]))


def test_the_logger_example(page_plugins, tmp_path):
    logger = the(page_plugins, "loggers", "csv")(None, tmp_path)
    logger.log({"critic/score/mean": 0.5, "actor/pg_loss": -0.25}, step=3)
    logger.close()
    rows = (tmp_path / "metrics.csv").read_text(encoding="utf-8").splitlines()
    assert rows == ["3,actor/pg_loss,-0.25", "3,critic/score/mean,0.5"]


def test_the_config_section_example(page_plugins, tmp_path):
    manager = next(m for m in page_plugins.values() if "rollout.my_engine" in m.registry("config_sections"))
    job = tmp_path / "job.toml"
    job.write_text("[rollout.my_engine]\nmax_batch = 32\n", encoding="utf-8")
    assert load_job(job, manager=manager, check=False).config.section("rollout.my_engine").max_batch == 32
    with pytest.raises(ConfigError, match="rollout.my_engine.cache_dtype"):
        load_job(job, ["rollout.my_engine.cache_dtype=fp4"], manager=manager, check=False)


def test_the_command_example(page_plugins, capsys):
    command = the(page_plugins, "cli_commands", "hello")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert command.run(parser.parse_args(["world"])) == 0
    assert capsys.readouterr().out == "hello, world\n"


def test_the_registrations_copied_from_built_in_plugins(page_plugins):
    """The backend, engine and platform blocks are the built-in plugins' own registrations."""
    from rlcore_fsdp.backend import FsdpBackend
    from rlcore_rocm.platform import RocmPlatform

    assert isinstance(the(page_plugins, "training_backends", "fsdp"), FsdpBackend)
    assert the(page_plugins, "platforms", "rocm") is RocmPlatform
    engine = the(page_plugins, "rollout_engines", "vllm")
    assert engine.requires == ("vllm",)
    assert the(page_plugins, "cli_commands", "export").help
