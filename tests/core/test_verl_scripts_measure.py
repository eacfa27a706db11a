"""``benchmarks/verl_scripts.py``, the count of verl example scripts rlcore takes as they are, on a
made-up checkout: scripts that run main_ppo are checked, others skipped, refusals counted by key."""

from __future__ import annotations

import sys

from tests.conftest import REPO
from tests.processes import run_process

SCRIPTS = {
    "examples/ok/run.sh": "LR=1e-6\npython3 -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lr=$LR "
                          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 "
                          "actor_rollout_ref.model.use_remove_padding=True trainer.n_gpus_per_node=2\n",
    "examples/cp/run.sh": "python3 -m verl.trainer.main_ppo "
                          "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 "
                          "actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size=2\n",
    "examples/sft/run.sh": "torchrun -m verl.trainer.fsdp_sft_trainer data.train_batch_size=8\n",
}


def test_the_scripts_that_run_main_ppo_are_counted_and_refusals_listed_by_key(tmp_path):
    for name, text in SCRIPTS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = run_process([sys.executable, str(REPO / "benchmarks" / "verl_scripts.py"), "--checkout", str(tmp_path),
                          "--verbose"], name="verl_scripts.py", timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1 of 2 scripts that run main_ppo validate (keys only)"
    assert lines[1].split() == ["1", "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"]
    assert lines[2].split() == ["1", "actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size"]
    assert "examples/cp/run.sh" in result.stdout and "examples/ok/run.sh" not in result.stdout
