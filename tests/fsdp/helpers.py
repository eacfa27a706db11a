"""Configs and batches for backend and engine tests on the tiny model."""

from __future__ import annotations

import attrs
import torch

from rlcore.batch import Batch
from rlcore.config.schema import (
    ActorConfig,
    CriticConfig,
    DataConfig,
    JobConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
)

PROMPT_LENGTH, RESPONSE_LENGTH = 6, 8


def job(model_path, *, actor: dict | None = None, critic: dict | None = None, rollout: dict | None = None,
        lr: float = 1e-3, dtype: str = "float32", sections: dict | None = None) -> JobConfig:
    """A job on ``model_path`` with 4-prompt mini-batches, no weight decay and the given overrides;
    fp32 by default on every platform, so that results can be compared exactly. ``sections``: plugin
    tables by path (``{"actor.fsdp": FsdpOptions(...)}``)."""
    optim = OptimConfig(lr=lr, weight_decay=0.0)
    return JobConfig(
        model=ModelConfig(path=str(model_path), dtype=dtype),
        actor=ActorConfig(**{"ppo_mini_batch_size": 4, "optim": optim, **(actor or {})}),
        critic=CriticConfig(**{"optim": optim, **(critic or {})}),
        rollout=RolloutConfig(**(rollout or {})),
        data=DataConfig(max_response_length=RESPONSE_LENGTH, max_prompt_length=PROMPT_LENGTH),
        sections=dict(sections or {}),
    )


def evolve(config: JobConfig, **sections) -> JobConfig:
    return attrs.evolve(config, **{k: attrs.evolve(getattr(config, k), **v) for k, v in sections.items()})


def make_batch(rows: int = 4, seed: int = 0, vocab: int = 500) -> Batch:
    """Rows as the rollout hands them over: prompts left-padded, responses right-padded, each row
    with its own prompt and response length (so micro-batches hold different token counts)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (rows, PROMPT_LENGTH), generator=g)
    responses = torch.randint(3, vocab, (rows, RESPONSE_LENGTH), generator=g)
    prompt_mask = torch.ones(rows, PROMPT_LENGTH, dtype=torch.long)
    response_mask = torch.ones(rows, RESPONSE_LENGTH, dtype=torch.long)
    for row in range(rows):
        prompt_mask[row, : row % 3] = 0  # 0, 1 or 2 pads on the left
        response_mask[row, RESPONSE_LENGTH - 2 * (row % 4):] = 0  # 8, 6, 4 or 2 response tokens
    prompts = torch.where(prompt_mask.bool(), prompts, 0)
    responses = torch.where(response_mask.bool(), responses, 0)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    return Batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
    })


def full_weights(actor_or_critic) -> dict[str, torch.Tensor]:
    """Every full parameter by name, as fp32 CPU tensors."""
    from rlcore_fsdp.sharding import full_tensor

    module = actor_or_critic.module
    return {name: full_tensor(p.detach()).float().cpu().clone() for name, p in module.named_parameters()}
