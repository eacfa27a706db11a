"""The jobs of the side-by-side with verl 0.9.1, as command-line overrides for both systems, and verl's
run: ``python3 -m verl.trainer.main_ppo`` in a process of its own, its metrics read back from verl's
``file`` logger into the record format of ``grpo_step.py``.

Jobs (``JOBS``):

- ``a``: the GSM8K GRPO job of ``examples/gsm8k_grpo_smollm2.toml`` (SmolLM2-135M-Instruct, 64 prompts x 8,
  <= 512 new tokens, KL loss 0.001 low_var_kl, lr 1e-6, vLLM at 0.3 of the GPU, no validation), in
  verl's keys for verl; rlcore runs the example file itself.
- ``grpo-line``, ``ppo-line``: verl's quickstart lines (the issue's text, ``PPO_LINE`` and ``GRPO_LINE``),
  both systems given the same keys; only the keys the issue lets change are changed: the model and data
  paths, ``trainer.total_training_steps`` (``trainer.total_epochs`` stays), ``trainer.save_freq`` and
  ``test_freq`` (-1: no checkpoint, no validation inside the timed steps) and ``data.train_batch_size``
  with ``ppo_mini_batch_size`` (``--batch``/``--mini``, the same cut for both).

What verl needs besides, on a GPU image without flash-attn (``VERL_ONLY``): its model config asks for
``attn_implementation=flash_attention_2`` by default, which transformers refuses without the package, so
verl's models are told ``sdpa`` (with ``use_remove_padding`` verl then packs rows and transformers masks
them apart); ``verl_shims/sitecustomize.py`` on verl's ``PYTHONPATH``, since verl's critic loader asks
for flash_attention_2 whatever the critic's config says (the shim passes the configured ``sdpa`` instead)
and verl's model patching imports a class TRL 1.16 no longer has wherever TRL is installed (the shim hides
TRL from verl); and the ``file`` logger beside ``console``, whose lines (``{"step": n, "data": {...}}``,
written by ``verl.utils.tracking.FileLogger`` to ``$VERL_FILE_LOGGER_PATH``) are the measurement.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

JOBS = ("a", "grpo-line", "ppo-line")
VERL_SHIMS = Path(__file__).resolve().parent / "verl_shims"

# The PPO line, key for key (data.train_files and data.val_files come with the run).
PPO_LINE = """data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=512
actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 critic.optim.lr=1e-5
critic.model.path=Qwen/Qwen2.5-0.5B-Instruct critic.ppo_micro_batch_size_per_gpu=4
algorithm.use_kl_in_reward=True algorithm.kl_ctrl.kl_coef=0.001 trainer.logger=console
trainer.val_before_train=False trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.save_freq=10
trainer.test_freq=10 trainer.total_epochs=15""".split()

# The GRPO line the tutorials derive from it: without critic.*, with these keys set (or added).
GRPO_CHANGES = """algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False data.max_response_length=1024
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8""".split()


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+")


def with_overrides(overrides: list[str], changes: list[str]) -> list[str]:
    """``overrides`` with each of ``changes`` replacing the override of its key, or appended."""
    out, pending = list(overrides), {_key(c): c for c in changes}
    for i, item in enumerate(out):
        if _key(item) in pending:
            out[i] = pending.pop(_key(item))
    return out + list(pending.values())


GRPO_LINE = with_overrides([o for o in PPO_LINE if not o.startswith("critic.")], GRPO_CHANGES)
LINES = {"ppo-line": PPO_LINE, "grpo-line": GRPO_LINE}


def line_overrides(job: str, model: Path, train: Path, val: Path, steps: int, batch: int | None = None,
                   mini: int | None = None, timed: bool = True) -> list[str]:
    """The issue's line for ``job`` with only the keys it lets change changed (same for both systems);
    ``timed``: no checkpoint and no validation (``save_freq``, ``test_freq`` -1), which verl would
    otherwise do at the last step, inside the timed step."""
    changes = [f"data.train_files={train}", f"data.val_files={val}", f"actor_rollout_ref.model.path={model}",
               f"trainer.total_training_steps={steps}"]
    if timed:
        changes += ["trainer.save_freq=-1", "trainer.test_freq=-1"]
    if job == "ppo-line":
        changes.append(f"critic.model.path={model}")
    if batch is not None:
        changes.append(f"data.train_batch_size={batch}")
    if mini is not None:
        changes.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}")
    return with_overrides(LINES[job], changes)


def job_a_verl(model: Path, train: Path, val: Path, steps: int) -> list[str]:
    """``examples/gsm8k_grpo_smollm2.toml`` in verl's keys (the TOML's sections are verl's
    ``actor_rollout_ref.*`` groups; rlcore reads both spellings)."""
    return [
        f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=64", "data.max_prompt_length=512", "data.max_response_length=512",
        "data.filter_overlong_prompts=True", "data.truncation=error",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=65536",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.project_name=rlcore_examples", "trainer.experiment_name=gsm8k_grpo_smollm2",
    ]


def verl_only(job: str) -> list[str]:
    """What verl needs on this GPU image beside the job's keys (module docstring)."""
    extra = ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "trainer.logger=[console,file]"]
    if job == "ppo-line":
        extra.append("+critic.model.override_config.attn_implementation=sdpa")
    return extra


def verl_command(overrides: list[str], job: str, run_dir: Path) -> list[str]:
    """``python -m verl.trainer.main_ppo`` with the job's overrides, verl's extras and a checkpoint folder."""
    return [sys.executable, "-m", "verl.trainer.main_ppo", *with_overrides(overrides, verl_only(job)),
            f"trainer.default_local_dir={run_dir / 'checkpoints'}"]


# -- verl's metrics ----------------------------------------------------------------------------------
def read_file_logger(path: Path) -> list[dict]:
    """verl's ``file`` logger lines (``{"step": n, "data": {metric: value}}``) as one dict per line,
    the step under ``step``."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            rows.append({**record["data"], "step": record["step"]})
    return rows


def steps_of(metrics: list[dict]) -> list[dict]:
    """``grpo_step.py``'s per-step record (step_s, gen_s, tokens, phases, score, response_length, the
    actor's and critic's grad norms) from verl's or rlcore's metrics (the same names: ``timing_s/*``,
    ``perf/total_num_tokens``, ``actor/grad_norm``)."""
    return [{"step_s": m["timing_s/step"], "gen_s": m["timing_s/gen"], "tokens": m.get("perf/total_num_tokens"),
             "phases": {k.removeprefix("timing_s/"): round(v, 3) for k, v in m.items() if k.startswith("timing_s/")},
             "score": m.get("critic/score/mean"), "response_length": m.get("response_length/mean"),
             "grad_norm": {k.split("/")[0]: m[k] for k in ("actor/grad_norm", "critic/grad_norm") if k in m}}
            for m in metrics if m.get("step", 0) >= 1 and "timing_s/step" in m]


def verl_environment(metrics_file: Path) -> dict[str, str]:
    """The environment of every verl job: its file logger's path, and ``verl_shims`` first on its
    ``PYTHONPATH`` (the critic loader's hard-coded flash_attention_2; TRL hidden)."""
    return {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_file), "RAY_AUTH_MODE": "disabled",
            "HYDRA_FULL_ERROR": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(VERL_SHIMS), os.environ.get("PYTHONPATH")]))}


def run_verl(overrides: list[str], job: str, run_dir: Path, timeout_s: int, memory_peak,
             metrics_name: str = "verl_metrics.jsonl") -> dict:
    """verl's job in a process of its own (its own Ray cluster), cwd ``run_dir``; its metrics file
    (``metrics_name`` in ``run_dir``: verl's file logger starts it afresh, so a resumed run takes another name)
    read back."""
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / metrics_name
    command, env = verl_command(overrides, job, run_dir), verl_environment(metrics_file)
    print("$", shlex.join(command), flush=True)
    from sitting import RanPastDeadline, run_bounded

    stopped = None
    with memory_peak as memory:
        try:
            run_bounded(command, timeout_s, cwd=run_dir, env=env)
        except RanPastDeadline as deadline:  # the steps verl finished are still measured, and said to be fewer
            print(deadline, flush=True)
            stopped = f"killed at {timeout_s} s"
    from importlib.metadata import version

    if not metrics_file.is_file():  # the variable did not reach verl's TaskRunner: its default place, under its cwd
        found = sorted(run_dir.rglob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        if not found and stopped is None:
            raise SystemExit(f"verl wrote no metrics file ({metrics_file}, nor any *.jsonl under {run_dir})")
        metrics_file = found[-1] if found else None
    steps = steps_of(read_file_logger(metrics_file)) if metrics_file else []
    return {"steps": steps, "peak_gpu_gb": memory.peak_gb, "overrides": command[3:], "job": job,
            "verl": version("verl"), "vllm": version("vllm"), **({"stopped": stopped} if stopped else {})}
