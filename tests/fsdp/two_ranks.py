"""The 2-rank half of test_two_ranks.py: run as ``python -m tests.fsdp.two_ranks MODEL OUT`` in two
processes with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), on the CPU (gloo).

Each rank writes ``OUT/rank<r>.pt``: full gradients, metrics and weights of the steps below, its
log-probs, and (after saving a checkpoint into ``OUT/step1/actor``) the step after the checkpoint
taken twice, by the running actor and by one resumed from the checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlcore.batch import Batch
from rlcore.testing import build_actor, build_critic
from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, job, make_batch

ROWS = 8
# what both halves of the test run: (name, actor settings, packed)
ACTOR_RUNS = [
    ("padded", {"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": 2}, False),
    ("packed_dynamic", {"ppo_mini_batch_size": ROWS, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 20,
                        "loss_agg_mode": "seq-mean-token-mean", "entropy_coeff": 0.01}, True),
    ("lora", {"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": 2, "lora_rank": 4}, False),
]
UNEVEN_SPLIT = 5  # rank 0 takes rows 0-4, rank 1 rows 5-7, for the forward-only pass
UNEVEN_BUDGET = 14


def advantages(rows: int = ROWS) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, rows * RESPONSE_LENGTH).view(rows, RESPONSE_LENGTH)


def returns(rows: int = ROWS) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, rows).unsqueeze(-1).expand(rows, RESPONSE_LENGTH).contiguous()


def config(model_path, actor: dict, packed: bool):
    """The job of a run; its ``lora_rank`` (a model setting) rides along with the actor's."""
    import attrs

    actor = dict(actor)
    lora_rank = actor.pop("lora_rank", 0)
    job_config = job(model_path, actor=actor)
    return attrs.evolve(job_config, model=attrs.evolve(job_config.model, use_remove_padding=packed,
                                                       lora_rank=lora_rank))


def capture_gradients(role) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}
    original = role.optimizer.step

    def step(*args, **kwargs):
        for name, param in role.module.named_parameters():
            if param.grad is not None:  # frozen weights (LoRA's base) have none
                grads[name] = param.grad.full_tensor().clone()
        return original(*args, **kwargs)

    role.optimizer.step = step
    return grads


def actor_step(actor, batch: Batch, adv: torch.Tensor) -> dict:
    grads = capture_gradients(actor)
    step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": adv}))
    metrics = actor.update(step)
    return {"metrics": metrics, "grads": grads, "weights": full_weights(actor)}


def critic_step(critic, batch: Batch, ret: torch.Tensor) -> dict:
    step = batch.update(critic.compute_values(batch)).update(Batch({"returns": ret}))
    return {"metrics": critic.update(step), "weights": full_weights(critic)}


def main(model_path: str, out: str) -> None:
    from rlcore.plugins.manager import get_manager

    torch.set_num_threads(1)
    manager = get_manager()
    backend = manager.get("training_backends", "fsdp")
    platform = manager.get("platforms", "cpu")()
    results: dict = {}
    batch, adv = None, None
    for name, actor_settings, packed in ACTOR_RUNS:
        actor = build_actor(backend, config(model_path, actor_settings, packed), platform)
        rank, ranks = dist.get_rank(), dist.get_world_size()
        share = slice(rank * ROWS // ranks, (rank + 1) * ROWS // ranks)
        batch, adv = make_batch(ROWS).select(range(ROWS)[share]), advantages()[share]
        results[name] = actor_step(actor, batch, adv)

    # forward-only over uneven shares: ranks need different numbers of micro-batches; fillers even them
    uneven = dict(ACTOR_RUNS[1][1], ppo_max_token_len_per_gpu=UNEVEN_BUDGET)
    actor = build_actor(backend, config(model_path, uneven, True), platform)
    rows = range(UNEVEN_SPLIT) if dist.get_rank() == 0 else range(UNEVEN_SPLIT, ROWS)
    results["uneven_log_probs"] = actor.compute_log_prob(make_batch(ROWS).select(rows))["old_log_probs"]

    critic = build_critic(backend, config(model_path, ACTOR_RUNS[0][1], False), platform)
    results["critic"] = critic_step(critic, batch, returns()[share])

    # a checkpoint after one step; then step 2 by the running actor and by a resumed one
    actor = build_actor(backend, config(model_path, *ACTOR_RUNS[0][1:]), platform)
    actor_step(actor, batch, adv)
    actor.save(str(Path(out) / "step1" / "actor"))
    results["step1_weights"] = full_weights(actor)
    results["step2_running"] = actor_step(actor, batch, -adv)
    resumed = build_actor(backend, config(model_path, *ACTOR_RUNS[0][1:]), platform)
    resumed.load(str(Path(out) / "step1" / "actor"))
    results["step2_resumed"] = actor_step(resumed, batch, -adv)
    torch.save(results, Path(out) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
