"""Numbers are finite: config floats and integers checked at validation; a run whose updates keep
being skipped for non-finite values stops naming the step and the values."""

import pytest

from rlcore.config import load_job
from rlcore.errors import ConfigError, RlcoreError
from rlcore.metrics.finite import NonFiniteGuard
from rlcore.plugins.manager import PluginManager


def test_non_finite_floats_and_oversized_integers_are_refused_naming_each_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[actor]\nentropy_coeff = nan\n[actor.optim]\nlr = inf\n")
    with pytest.raises(ConfigError) as info:
        load_job(path, ["trainer.seed=18446744073709551616", "data.seed=9223372036854775807",
                        "algorithm.gamma=-inf"], manager=PluginManager(autoload=False))
    message = str(info.value)
    # the fifth: the rest of the job is checked in the same pass, and this manager (no entry points)
    # has no training backend to default to
    assert "5 problems" in message and "trainer.backend is not set" in message
    assert "actor.optim.lr: expected a finite number, got inf" in message
    assert "actor.entropy_coeff: expected a finite number, got nan" in message
    assert "algorithm.gamma: expected a finite number, got -inf" in message
    assert "trainer.seed: expected a 64-bit integer" in message


def test_skipped_updates_are_counted_then_stop_the_run_naming_step_and_values(caplog):
    guard = NonFiniteGuard(max_steps=1)
    assert guard.check(1, {"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "actor/nonfinite_updates": 0.0}) == {
        "training/nonfinite_steps": 0.0}
    bad = {"actor/pg_loss": float("nan"), "actor/grad_norm": float("nan"), "actor/nonfinite_updates": 1.0}
    assert guard.check(2, bad) == {"training/nonfinite_steps": 1.0}
    assert "step 2: update skipped" in caplog.text
    with pytest.raises(RlcoreError, match=r"step 3: .*actor/pg_loss = nan, actor/grad_norm = nan.*"
                                          r"trainer.max_nonfinite_steps = 1"):
        guard.check(3, bad)


def test_a_backend_that_does_not_count_is_caught_by_its_values():
    with pytest.raises(RlcoreError, match=r"step 1: .*critic/vf_loss = inf"):
        NonFiniteGuard(max_steps=0).check(1, {"critic/vf_loss": float("inf")})


def test_with_no_update_through_the_learning_rate_is_not_blamed_and_the_trainers_suspects_come_first():
    """A job whose trainer computed NaN from its first step (under a device share that computes wrong)
    was told to lower the learning rate, which no update had used yet (2026-12-06)."""
    guard = NonFiniteGuard(max_steps=0)
    guard.suspects.append("The trainer runs under a limited share; set async_training.trainer_compute_share = 0.5.")
    with pytest.raises(RlcoreError) as first_step:
        guard.check(1, {"actor/kl_loss": float("nan"), "actor/nonfinite_updates": 1.0})
    message = str(first_step.value)
    assert "learning rate is not the cause" in message and "Lower actor.optim.lr" not in message
    assert "set async_training.trainer_compute_share = 0.5" in message
    later = NonFiniteGuard(max_steps=0)
    later.check(1, {"actor/pg_loss": 0.1, "actor/nonfinite_updates": 0.0})
    with pytest.raises(RlcoreError, match=r"Lower actor.optim.lr / critic.optim.lr"):
        later.check(2, {"actor/pg_loss": float("nan"), "actor/nonfinite_updates": 1.0})
