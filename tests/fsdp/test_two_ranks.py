"""Two ranks (two processes, gloo on the CPU) against one: the same losses, gradients and steps for
padded and packed + dynamic micro-batches, for the actor and the critic; forward passes over
uneven shares; a checkpoint saved at 2 ranks resumes at 2 and loads at 1.

The 2-rank run is ``tests/fsdp/two_ranks.py``, started once for the whole module; the 1-rank side
runs here on the whole batch with the same settings.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.testing import build_actor, build_critic
from rlcore_fsdp.export import read_full_weights
from tests.fsdp import two_ranks
from tests.fsdp.helpers import full_weights, make_batch
from tests.ranks import run_ranks


@pytest.fixture(scope="module")
def two(tiny_model_path, tmp_path_factory):
    """Results of the 2-rank run, rank 0's and rank 1's, and its output folder."""
    out = tmp_path_factory.mktemp("two-ranks")
    run_ranks("tests.fsdp.two_ranks", str(tiny_model_path), str(out))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], out


@pytest.fixture(scope="module")
def cpu():
    from rlcore.plugins.manager import get_manager

    return get_manager().get("platforms", "cpu")()


def one_rank_step(backend, cpu, model_path, actor_settings, packed) -> dict:
    actor = build_actor(backend, two_ranks.config(model_path, actor_settings, packed), cpu)
    return two_ranks.actor_step(actor, make_batch(two_ranks.ROWS), two_ranks.advantages())


def across_ranks(results: list[dict], key: str) -> dict:
    """Rank 0's step with the metrics averaged over ranks, as the worker group reports them."""
    metrics = [r[key]["metrics"] for r in results]
    return {**results[0][key], "metrics": {k: sum(m[k] for m in metrics) / len(metrics) for k in metrics[0]}}


ADAM_LR = 1e-3  # tests.fsdp.helpers.job's learning rate
RESOLVED_GRAD = 1e-5  # ten times the gradients' absolute tolerance


def assert_same_step(got: dict, expected: dict, prefix: str = "actor", loss: str = "pg_loss") -> None:
    for key in (f"{prefix}/{loss}", f"{prefix}/grad_norm"):
        assert got["metrics"][key] == pytest.approx(expected["metrics"][key], rel=1e-5, abs=1e-7), key
    for name, grad in expected.get("grads", {}).items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-6, rtol=1e-4)
    # Adam's first step moves a weight by lr * g / (|g| + eps): about lr * sign(g), except where g is
    # so small that the gradients' tolerance above cannot fix its sign or size. Those weights may differ
    # by up to one step (ADAM_LR each way); every other weight must agree to within a twentieth of one.
    grads = expected.get("grads", {})
    for name, value in expected["weights"].items():
        resolved = grads[name].abs() > RESOLVED_GRAD if name in grads else torch.ones_like(value, dtype=torch.bool)
        torch.testing.assert_close(got["weights"][name][resolved], value[resolved], atol=5e-5, rtol=0)
        torch.testing.assert_close(got["weights"][name], value, atol=2 * ADAM_LR, rtol=0)


@pytest.mark.parametrize("run", two_ranks.ACTOR_RUNS, ids=[r[0] for r in two_ranks.ACTOR_RUNS])
def test_two_ranks_give_the_one_rank_step(backend, cpu, tiny_model_path, two, run):
    name, actor_settings, packed = run
    results, _ = two
    expected = one_rank_step(backend, cpu, tiny_model_path, actor_settings, packed)
    assert_same_step(across_ranks(results, name), expected)
    for param, grad in results[0][name]["grads"].items():  # every rank holds the same full gradients
        assert torch.equal(results[1][name]["grads"][param], grad)


def test_two_rank_critic_gives_the_one_rank_step(backend, cpu, tiny_model_path, two):
    results, _ = two
    critic = build_critic(backend, two_ranks.config(tiny_model_path, *two_ranks.ACTOR_RUNS[0][1:]), cpu)
    expected = two_ranks.critic_step(critic, make_batch(two_ranks.ROWS), two_ranks.returns())
    assert_same_step(across_ranks(results, "critic"), expected, prefix="critic", loss="vf_loss")


def test_uneven_shares_with_dynamic_micro_batches_give_every_rows_log_probs(backend, cpu, tiny_model_path, two):
    results, _ = two
    batch = make_batch(two_ranks.ROWS)
    actor = build_actor(backend, two_ranks.config(tiny_model_path, *two_ranks.ACTOR_RUNS[1][1:]), cpu)
    expected = actor.compute_log_prob(batch)["old_log_probs"]
    got = torch.cat([results[0]["uneven_log_probs"], results[1]["uneven_log_probs"]])
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)


def test_a_checkpoint_saved_at_two_ranks_resumes_at_two(two):
    results, out = two
    assert sorted(p.name for p in (out / "step1" / "actor" / "shards").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # one shard file per rank
    for rank in range(2):
        running, resumed = results[rank]["step2_running"], results[rank]["step2_resumed"]
        assert resumed["metrics"] == running["metrics"]
        for name, value in running["weights"].items():
            assert torch.equal(resumed["weights"][name], value), name


def test_a_checkpoint_saved_at_two_ranks_loads_at_one(backend, cpu, tiny_model_path, two):
    """Resharded onto one rank: the same weights and AdamW state, so the same next step (up to the
    sums' order); and it exports."""
    results, out = two
    config = two_ranks.config(tiny_model_path, *two_ranks.ACTOR_RUNS[0][1:])
    actor = build_actor(backend, config, cpu)
    actor.load(str(out / "step1" / "actor"))
    for name, value in results[0]["step1_weights"].items():
        assert torch.equal(full_weights(actor)[name], value), name
        assert torch.equal(read_full_weights(out / "step1" / "actor")[name], value), name
    step = two_ranks.actor_step(actor, make_batch(two_ranks.ROWS), -two_ranks.advantages())
    assert step["metrics"]["actor/lr"] == results[0]["step2_running"]["metrics"]["actor/lr"]
    assert_same_step(step, across_ranks(results, "step2_running"))
    assert actor.schedule.step == 2
