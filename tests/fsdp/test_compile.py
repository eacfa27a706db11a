"""``actor.use_torch_compile``: the actor's decoder layers run compiled (torch.compile), forward and
backward, and give the uncompiled numbers: log-probs, loss, gradients and the step's weights."""

from __future__ import annotations

import pytest
import torch

from rlcore.testing import build_actor
from tests.fsdp import two_ranks
from tests.fsdp.helpers import make_batch
from tests.fsdp.test_two_ranks import assert_same_step

pytestmark = pytest.mark.slow  # compiling on a 2-core CPU takes tens of seconds
ROWS = 4
SETTINGS = {"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": ROWS}


def _step(backend, platform, model_path, compiled: bool, settings=SETTINGS, packed=False,
          checkpointing=False) -> tuple[dict, torch.Tensor]:
    import attrs

    config = two_ranks.config(model_path, {**settings, "use_torch_compile": compiled}, packed)
    config = attrs.evolve(config, model=attrs.evolve(config.model, enable_gradient_checkpointing=checkpointing))
    actor = build_actor(backend, config, platform)
    batch = make_batch(ROWS)
    log_probs = actor.compute_log_prob(batch)["old_log_probs"]
    return two_ranks.actor_step(actor, batch, two_ranks.advantages(ROWS)), log_probs


def test_a_compiled_actor_gives_the_eager_numbers(backend, platform, tiny_model_path):
    torch._dynamo.reset()
    compiled, compiled_log_probs = _step(backend, platform, tiny_model_path, True)
    eager, eager_log_probs = _step(backend, platform, tiny_model_path, False)
    mask = make_batch(ROWS)["response_mask"].bool()
    torch.testing.assert_close(compiled_log_probs[mask], eager_log_probs[mask], atol=1e-5, rtol=1e-5)
    assert_same_step(compiled, eager)
    # the layers did run compiled: dynamo holds compiled code for them
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0


def test_compiled_checkpointed_layers_over_packed_micro_batches_give_the_eager_numbers(backend, platform,
                                                                                    tiny_model_path):
    """The 1.5B shape's way (gradient checkpointing, packed rows) with compiled layers: the backward recomputes
    each layer's compiled forward; over micro-batches of one row (their packed lengths differ, and on one device
    their gradients accumulate unreduced) the step is the eager one."""
    torch._dynamo.reset()
    settings = {"ppo_mini_batch_size": ROWS, "ppo_micro_batch_size_per_gpu": 1}
    runs = [_step(backend, platform, tiny_model_path, compiled, settings, packed=True, checkpointing=True)
            for compiled in (True, False)]
    (compiled, compiled_log_probs), (eager, eager_log_probs) = runs
    mask = make_batch(ROWS)["response_mask"].bool()
    torch.testing.assert_close(compiled_log_probs[mask], eager_log_probs[mask], atol=1e-5, rtol=1e-5)
    assert_same_step(compiled, eager)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0
