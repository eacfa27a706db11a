"""``benchmarks/verl_jobs.py``: verl's quickstart lines as the issue gives them, changed only where it
allows; verl's ``file`` logger lines read into ``grpo_step.py``'s records; and, where verl is
installed, every override of every job accepted by verl's own config schema and checks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import grpo_step  # noqa: E402
import sitting  # noqa: E402
import verl_jobs  # noqa: E402

# The keys the issue lets change for a run here (and the data files, which come with every run)
ALLOWED = {"data.train_files", "data.val_files", "actor_rollout_ref.model.path", "critic.model.path",
           "trainer.total_epochs", "trainer.total_training_steps", "trainer.save_freq", "trainer.test_freq",
           "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"}


def as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_the_grpo_line_is_the_ppo_line_without_the_critic_and_with_the_tutorials_changes():
    ppo, grpo = as_dict(verl_jobs.PPO_LINE), as_dict(verl_jobs.GRPO_LINE)
    assert len(ppo) == len(verl_jobs.PPO_LINE) == 24
    assert not any(k.startswith("critic.") for k in grpo)
    assert grpo["algorithm.adv_estimator"] == "grpo" and grpo["algorithm.use_kl_in_reward"] == "False"
    assert grpo["data.max_response_length"] == "1024" and grpo["actor_rollout_ref.rollout.n"] == "5"
    assert grpo["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert grpo["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == "8"
    same = {k for k in ppo if not k.startswith("critic.")} - {"algorithm.use_kl_in_reward", "data.max_response_length",
                                                              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"}
    assert all(grpo[k] == ppo[k] for k in same)


@pytest.mark.parametrize("job", ["ppo-line", "grpo-line"])
def test_a_run_of_a_line_changes_only_the_keys_the_issue_allows(job, tmp_path):
    line = as_dict(verl_jobs.LINES[job])
    run = as_dict(verl_jobs.line_overrides(job, tmp_path / "m", tmp_path / "t.parquet", tmp_path / "v.parquet", 2,
                                           batch=64, mini=16))
    changed = {k for k in run if run[k] != line.get(k)}
    assert changed <= ALLOWED and set(line) <= set(run)
    assert run["trainer.total_training_steps"] == "2" and run["trainer.total_epochs"] == "15"
    assert run["data.train_batch_size"] == "64" and run["actor_rollout_ref.actor.ppo_mini_batch_size"] == "16"
    assert (run.get("critic.model.path") == str(tmp_path / "m")) == (job == "ppo-line")


def test_verl_gets_sdpa_and_its_file_logger_beside_the_jobs_keys(tmp_path):
    job = verl_jobs.job_a_verl(tmp_path / "m", tmp_path / "t", tmp_path / "v", 5)
    command = verl_jobs.verl_command(job, "a", tmp_path)
    assert command[1:3] == ["-m", "verl.trainer.main_ppo"]
    keys = as_dict(command[3:])
    assert keys["trainer.logger"] == "[console,file]"
    assert keys["+actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    ppo = as_dict(verl_jobs.verl_command(verl_jobs.PPO_LINE, "ppo-line", tmp_path)[3:])
    assert ppo["+critic.model.override_config.attn_implementation"] == "sdpa" and ppo["trainer.logger"] == "[console,file]"


# Two lines as verl 0.9.1's FileLogger writes them (verl/utils/tracking.py: orjson.dumps({"step": step,
# "data": data}) per logger.log call); the first a validation-only record, as val_before_train logs.
FILE_LOGGER_LINES = [
    {"step": 0, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.01}},
    {"step": 1, "data": {"timing_s/gen": 6.5, "timing_s/reward": 0.2, "timing_s/old_log_prob": 0.4, "timing_s/ref": 0.3,
                         "timing_s/adv": 0.01, "timing_s/update_actor": 2.1, "timing_s/update_weights": 0.3,
                         "timing_s/step": 9.9, "perf/total_num_tokens": 201234, "critic/score/mean": 0.02,
                         "response_length/mean": 341.5, "timing_per_token_ms/ref": 0.001}},
    {"step": 2, "data": {"timing_s/gen": 5.5, "timing_s/step": 8.0, "perf/total_num_tokens": 199000}},
]


def test_verls_file_logger_lines_become_the_benchmarks_step_records(tmp_path):
    path = tmp_path / "verl_metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in FILE_LOGGER_LINES))
    steps = verl_jobs.steps_of(verl_jobs.read_file_logger(path))
    assert [s["step_s"] for s in steps] == [9.9, 8.0] and [s["gen_s"] for s in steps] == [6.5, 5.5]
    assert steps[0]["tokens"] == 201234 and steps[0]["score"] == 0.02 and steps[0]["response_length"] == 341.5
    assert steps[0]["phases"] == {"gen": 6.5, "reward": 0.2, "old_log_prob": 0.4, "ref": 0.3, "adv": 0.01,
                                  "update_actor": 2.1, "update_weights": 0.3, "step": 9.9}
    results = tmp_path / "bench.jsonl"
    rlcore = {"system": "rlcore-vllm", "job": "a", "peak_gpu_gb": 30.0,
              "steps": [{"step_s": 6.0, "gen_s": 4.0, "tokens": 200000}] * 3}
    verl = {"system": "verl-vllm", "job": "a", "peak_gpu_gb": 40.0, "steps": steps}
    results.write_text(json.dumps(rlcore) + "\n" + json.dumps(verl) + "\n")
    table = grpo_step.table(results)
    assert "| a | verl-vllm | 8.00 (8.00-8.00) | 5.50 | 2.50 | 40.0 | 24,875 |" in table
    assert "a: rlcore-vllm / verl-vllm (step): 0.75" in table
    assert "a: rlcore-vllm / verl-vllm (non-generation s): 0.80" in table


def test_every_override_of_every_job_passes_verls_own_config_checks(tmp_path):
    """Where verl 0.9.1 is installed: its Hydra config composed from each job's overrides as
    ``main_ppo`` composes it (unknown keys refused), then verl's ``validate_config`` and its dataclass
    configs of the rollout, the model (loading a tiny model folder) and the critic."""
    for module in ("verl", "hydra", "tensordict"):  # verl alone (installed without its dependencies) cannot compose
        pytest.importorskip(module, reason=f"{module} is not installed (benchmarks/envs/verl-0.9.1.txt brings verl and it)")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from rlcore.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    data = (tmp_path / "train.parquet", tmp_path / "test.parquet")
    jobs = {"a": verl_jobs.job_a_verl(model, *data, 5),
            "grpo-line": verl_jobs.line_overrides("grpo-line", model, *data, 2, 64, 16),
            "ppo-line": verl_jobs.line_overrides("ppo-line", model, *data, 2, 64, 16)}
    for job, overrides in jobs.items():
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            config = compose(config_name="ppo_trainer", overrides=verl_jobs.verl_command(overrides, job, tmp_path)[3:])
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        OmegaConf.resolve(config)
        rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        assert rollout.name == "vllm" and rollout.n == {"a": 8, "grpo-line": 5, "ppo-line": 1}[job]
        assert omega_conf_to_dataclass(config.actor_rollout_ref.model).hf_config._attn_implementation == "sdpa"
        assert need_critic(config) == (job == "ppo-line") and need_reference_policy(config)
        assert list(config.trainer.logger) == ["console", "file"] and config.trainer.use_v1
        assert config.trainer.v1.trainer_mode == "sync"
        if job == "ppo-line":
            assert config.algorithm.use_kl_in_reward and config.algorithm.kl_ctrl.kl_coef == 0.001
            omega_conf_to_dataclass(config.critic)
        if job == "a":
            assert not rollout.free_cache_engine and rollout.gpu_memory_utilization == 0.3
            assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 32768
            assert rollout.log_prob_max_token_len_per_gpu == 65536


def test_a_job_past_its_deadline_is_killed_and_its_finished_steps_are_kept_and_marked(tmp_path):
    with pytest.raises(sitting.RanPastDeadline, match="ran past 1 s"):
        sitting.run_bounded([sys.executable, "-c", "import time; time.sleep(60)"], 1)
    results = tmp_path / "bench.jsonl"
    cut_short = {"system": "verl-vllm", "job": "a", "peak_gpu_gb": 95.0, "stopped": "killed at 540 s",
                 "steps": [{"step_s": 178.4, "gen_s": 22.1, "tokens": 228176},
                           {"step_s": 129.1, "gen_s": 16.1, "tokens": 220574}]}
    none = {"system": "verl-vllm+", "job": "a", "peak_gpu_gb": None, "stopped": "killed at 320 s", "steps": []}
    results.write_text(json.dumps(cut_short) + "\n" + json.dumps(none) + "\n")
    table = grpo_step.table(results)
    assert "| a | verl-vllm (2 steps, then killed at 540 s) | 129.10 (129.10-129.10) | 16.10 | 113.00 |" in table
    assert "| a | verl-vllm+ | no step finished (killed at 320 s) |" in table


LOAD_CRITIC = """
import sys, torch, transformers, verl.utils.model as m
config = transformers.AutoConfig.from_pretrained(sys.argv[1]); config._attn_implementation = "sdpa"
try:
    critic = m.load_valuehead_model(sys.argv[1], torch.float32, config, False)
except Exception as error:
    print("refused:", type(error).__name__); sys.exit(3)
print(type(critic).__name__, critic.config._attn_implementation, critic.config.num_labels)
"""


def test_the_shim_lets_verls_critic_load_with_the_attention_its_config_asks_for(tmp_path):
    """verl 0.9.1 loads the critic with flash_attention_2 whatever its config says (no flash-attn here:
    refused); with ``verl_shims`` on the path the same call loads it under sdpa."""
    pytest.importorskip("verl", reason="verl is not installed here (the GPU machine's benchmark environment)")
    import os
    import subprocess

    from tests.engine_models import build_engine_model

    model = build_engine_model(tmp_path / "tiny")
    base = os.environ.get("PYTHONPATH", "")

    def load(pythonpath: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", LOAD_CRITIC, str(model)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": pythonpath})

    without = load(base)
    assert without.returncode == 3 and "refused" in without.stdout, without.stderr[-2000:]
    shimmed = load(os.pathsep.join(filter(None, [str(verl_jobs.VERL_SHIMS), base])))
    assert shimmed.returncode == 0, shimmed.stderr[-2000:]
    assert shimmed.stdout.split()[-3:-1] == ["Qwen2ForTokenClassification", "sdpa"]


PATCH_A_MODEL = """
import sys, transformers
from verl.models.transformers.monkey_patch import apply_monkey_patch
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1])
try:
    apply_monkey_patch(model, ulysses_sp_size=1, use_remove_padding=False)
except ImportError as error:
    print("refused:", error); sys.exit(3)
print("patched")
"""


def test_the_shim_hides_trl_whose_missing_value_head_stopped_every_verl_model(tmp_path):
    """On the GPU (2026-12-06) TRL 1.16, installed for TRL's own rows, stopped verl 0.9.1 at its first model:
    wherever TRL can be found, ``apply_monkey_patch`` imports ``AutoModelForCausalLMWithValueHead`` from it,
    which TRL 1.16 no longer has. A ``trl`` package without that class fails the same way here; with
    ``verl_shims`` on the path verl finds no TRL and patches the model."""
    pytest.importorskip("verl", reason="verl is not installed here (the GPU machine's benchmark environment)")
    import subprocess

    from tests.engine_models import build_engine_model

    model = build_engine_model(tmp_path / "tiny")
    trl = tmp_path / "site" / "trl"  # TRL 1.16's top level: no value-head model, no trl.experimental.ppo
    trl.mkdir(parents=True)
    (trl / "__init__.py").write_text("__version__ = '1.16.0'\n")
    base = os.pathsep.join(filter(None, [str(trl.parent), os.environ.get("PYTHONPATH", "")]))

    def patch(pythonpath: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", PATCH_A_MODEL, str(model)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": pythonpath})

    without = patch(base)
    assert without.returncode == 3 and "AutoModelForCausalLMWithValueHead" in without.stdout, without.stderr[-2000:]
    shimmed = patch(os.pathsep.join([str(verl_jobs.VERL_SHIMS), base]))
    assert shimmed.returncode == 0 and shimmed.stdout.split()[-1] == "patched", shimmed.stderr[-2000:]


def test_every_verl_job_runs_with_the_shims_first_on_its_path(tmp_path, monkeypatch):
    """Job ``a`` ran without the shims and met TRL (above); every job's environment has them now."""
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    env = verl_jobs.verl_environment(tmp_path / "verl_metrics.jsonl")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(verl_jobs.VERL_SHIMS), "elsewhere"]
    assert env["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "verl_metrics.jsonl")
