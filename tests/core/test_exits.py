"""Every exit is truthful: code that calls sys.exit is reported as that code's failure (exit 2), a
run that stopped early exits non-zero, and plugin output stays off stdout."""

import argparse
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from rlcore import cli, hookimpl
from rlcore.cli import Command
from rlcore.config.schema import RewardConfig
from rlcore.errors import RlcoreError
from rlcore.plugins.manager import PluginManager
from rlcore.plugins.registry import Provider, Registry
from rlcore.rewards.custom import load_reward_function
from rlcore.rewards.scorer import RewardScorer

REPO = Path(__file__).resolve().parents[2]


def _registry(**functions):
    registry = Registry("reward_functions")
    for name, function in functions.items():
        registry.add(name, function, Provider("test", "test", "0"))
    return registry


def _exiting(data_source, solution_str, ground_truth, extra_info=None):
    sys.exit(0)


def test_a_reward_function_calling_sys_exit_fails_the_job_naming_it():
    scorer = RewardScorer(RewardConfig(), _registry(src=_exiting))
    with pytest.raises(RlcoreError, match=r"_exiting called sys.exit\(0\) at .*test_exits.py:\d+ on sample 0"):
        scorer.score(["src"], ["x"], ["1"], [None])


def test_a_reward_function_calling_sys_exit_scores_0_with_on_error_zero():
    # a budget of 1: the one sample of this batch may fail (the default 0.5 would stop the job)
    config = RewardConfig(on_error="zero", max_failed_share=1.0)
    result = RewardScorer(config, _registry(src=_exiting)).score(["src"], ["x"], ["1"], [None])
    assert result.scores.tolist() == [0.0] and result.metrics["reward/errors"] == 1.0


def test_a_reward_file_calling_sys_exit_on_import_is_named(tmp_path):
    (tmp_path / "r.py").write_text("import sys\nsys.exit(4)\n")
    with pytest.raises(RlcoreError, match=r"(?s)importing .*r\.py failed:.*SystemExit: 4"):
        load_reward_function(str(tmp_path / "r.py"))


def test_a_plugin_hook_calling_sys_exit_is_a_failed_plugin():
    def register(register):
        sys.exit(3)

    manager = PluginManager(autoload=False, plugins={
        "quits": types.SimpleNamespace(rlcore_register_loggers=hookimpl(register))})
    (failed,) = manager.failed
    assert failed.provider.plugin == "quits" and "called sys.exit(3)" in failed.error


def _main_with_command(monkeypatch, run) -> int:
    command = Command(help="x", configure=lambda p: None, run=run)

    def register(register):
        register("doit", command)

    manager = PluginManager(autoload=False, plugins={
        "cmd": types.SimpleNamespace(rlcore_register_cli_commands=hookimpl(register))})
    monkeypatch.setattr("rlcore.plugins.manager._manager", manager)
    return cli.main(["doit"])


def test_sys_exit_0_inside_a_command_is_an_error_naming_the_place(monkeypatch, capsys):
    assert _main_with_command(monkeypatch, lambda args: sys.exit(0)) == 2
    assert "called sys.exit(0) at" in capsys.readouterr().err


def test_a_real_ctrl_c_still_exits_130(monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    assert _main_with_command(monkeypatch, interrupted) == 130


def test_train_exits_non_zero_when_fewer_steps_ran_than_asked(monkeypatch):
    from rlcore.commands import train
    from rlcore.config.schema import JobConfig

    class StoppedEarly:
        def __init__(self, job):
            self.global_step, self.total_steps, self.run_dir = 3, 5, Path("run")

        def fit(self):
            return {}

    job = types.SimpleNamespace(config=JobConfig(), notes=(), warnings=(), source=None)
    monkeypatch.setattr("rlcore.config.load_job", lambda path, overrides, machine: job)
    monkeypatch.setattr("rlcore.commands.train.trainer_for", StoppedEarly)
    with pytest.raises(RlcoreError, match="training stopped at step 3 of 5"):
        train._run(argparse.Namespace(job=None, overrides=[]))


def test_plugins_that_print_or_exit_on_import_leave_json_stdout_clean(tmp_path):
    """Two installed plugins: one prints on import, one calls sys.exit(3) on import."""
    for name, body in (("noisy", "print('hello from noisy')\n"), ("quitter", "import sys\nsys.exit(3)\n")):
        (tmp_path / f"rlcore_{name}.py").write_text(body)
        info = tmp_path / f"rlcore_{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rlcore-{name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[rlcore]\n{name} = rlcore_{name}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "rlcore", "plugins", "--json"], capture_output=True,
                            text=True, env=env, cwd=str(REPO), timeout=120)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert "hello from noisy" in result.stderr
    assert "noisy" in {p["name"] for p in info["plugins"]}
    (quitter,) = [f for f in info["failed"] if f["name"] == "quitter"]
    assert "called sys.exit(3)" in quitter["error"] and "rlcore_quitter.py" in quitter["error"]
