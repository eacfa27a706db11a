"""The 2-rank half of test_ulysses.py: ``python -m tests.fsdp.ulysses_ranks MODEL OUT LLAMA`` in two processes
(gloo on the CPU), every role with Ulysses sequence parallelism 2, so both ranks form one group that
splits each packed micro-batch's sequence. Each rank is handed its own half of the rows, as the worker
group hands them out, and writes ``OUT/rank<r>.pt``: its log-probs, values and steps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import attrs
import torch
import torch.distributed as dist

from rlcore.testing import build_actor, build_critic, build_reference
from tests.fsdp import two_ranks
from tests.fsdp.helpers import make_batch

SP = 2
# (name, actor settings); every run packs rows (model.use_remove_padding), as Ulysses needs
RUNS = [
    ("micro_rows", {"ppo_mini_batch_size": two_ranks.ROWS, "ppo_micro_batch_size_per_gpu": 3,
                    "entropy_coeff": 0.01}),
    ("token_budget", {"ppo_mini_batch_size": two_ranks.ROWS // 2, "use_dynamic_bsz": True,
                      "ppo_max_token_len_per_gpu": 20, "loss_agg_mode": "seq-mean-token-mean"}),
]


def config(model_path, actor: dict, sp: int):
    job = two_ranks.config(model_path, {**actor, "ulysses_sequence_parallel_size": sp}, packed=True)
    return attrs.evolve(job, critic=attrs.evolve(job.critic, ulysses_sequence_parallel_size=sp))


def top_k_config(model_path, teacher_path, sp: int):
    """Distillation alone with the top-k forward KL (k = 4), the teacher a reference on ``teacher_path``."""
    job = config(model_path, RUNS[0][1], sp)
    return attrs.evolve(job, distillation=attrs.evolve(job.distillation, enable=True, teacher_path=str(teacher_path),
                                                       loss="forward_kl_topk", topk=4, use_task_rewards=False))


def top_k_step(backend, platform, job, batch) -> dict:
    """The teacher's top-k outputs for ``batch``, then an actor step on them; both in the result."""
    teacher = build_reference(backend, job, platform).compute_ref_log_prob(batch)
    step = two_ranks.actor_step(build_actor(backend, job, platform), batch.update(teacher),
                                torch.zeros_like(teacher["ref_log_prob"]))
    return {**step, "teacher": dict(teacher.tensors)}


def count_exchanges(results: dict) -> None:
    """Count the all-to-all exchanges around attention (rlcore.api's all_to_all, forward and backward),
    to show the sequence really was split."""
    original = dist.all_to_all_single
    results["exchanges"] = 0

    def counted(*args, **kwargs):
        results["exchanges"] += 1
        return original(*args, **kwargs)

    dist.all_to_all_single = counted


def main(model_path: str, out: str, llama_path: str) -> None:
    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    backend = manager.get("training_backends", "fsdp")
    platform = manager.get("platforms", "cpu")()
    rows = two_ranks.ROWS
    rank = int(os.environ["RANK"])  # the process group starts with the first role
    share = slice(rank * rows // 2, (rank + 1) * rows // 2)
    batch = make_batch(rows).select(range(rows)[share])
    results: dict = {}
    count_exchanges(results)
    for name, actor_settings in RUNS:
        actor = build_actor(backend, config(model_path, actor_settings, SP), platform)
        results[name] = two_ranks.actor_step(actor, batch, two_ranks.advantages()[share])
        results[name]["log_probs"] = actor.compute_log_prob(batch)["old_log_probs"]
    job = config(model_path, RUNS[0][1], SP)
    results["ref_log_probs"] = build_reference(backend, job, platform).compute_ref_log_prob(batch)["ref_log_prob"]
    critic = build_critic(backend, job, platform)
    results["values"] = critic.compute_values(batch)["values"]
    results["critic"] = two_ranks.critic_step(critic, batch, two_ranks.returns()[share])
    # uneven shares (5 and 3 rows): the group pools them all and each rank gets its own rows back; with the
    # sum of squared probabilities (actor.calculate_sum_pi_squared) gathered as the log-probs are
    uneven = make_batch(rows).select(range(5) if rank == 0 else range(5, rows))
    squares = attrs.evolve(job, actor=attrs.evolve(job.actor, calculate_sum_pi_squared=True))
    computed = build_actor(backend, squares, platform).compute_log_prob(uneven)
    results["uneven_log_probs"] = computed["old_log_probs"]
    results["uneven_sum_pi_squared"] = computed["sum_pi_squared"]
    # the top-k forward KL, the Llama below its teacher: the teacher's top k and the student's side gathered
    results["top_k"] = top_k_step(backend, platform, top_k_config(model_path, llama_path, SP), batch)
    # a Llama with one key/value head for 4 query heads: each rank takes copies of it
    actor = build_actor(backend, config(llama_path, RUNS[0][1], SP), platform)
    results["llama"] = two_ranks.actor_step(actor, batch, two_ranks.advantages()[share])
    torch.save(results, Path(out) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
