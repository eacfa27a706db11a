"""A whole GRPO job on the veomni backend: a tiny Qwen2 built by VeOmni's model code, the hf engine
generating with the actor's module, in the job's own process (``trainer.ray = false``); its last
checkpoint exported by the command the run's summary prints."""

from __future__ import annotations

import shlex

import pytest

from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.veomni.conftest import needs_veomni

# a few times what the 2-step job took on the idle 2-core machine
TIMEOUT_S = 120


def test_a_grpo_job_with_kl_loss_trains_validates_checkpoints_and_exports_on_veomni(tiny_model, gsm8k_parquet,
                                                                                     tmp_path):
    needs_veomni()
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore import cli

    run = tmp_path / "grpo"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run), "trainer.backend=veomni", "rollout.name=hf",
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true", "actor.kl_loss_type=mse",
                   timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reference: on, for actor.use_kl_loss" in result.stdout

    metrics = read_metrics(run)  # every value finite
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for step in metrics[1:]:
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "timing_s/ref"):
            assert name in step, name
        assert step["actor/grad_norm"] > 0 and step["actor/nonfinite_updates"] == 0
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # step 1: the actor is the reference
    assert metrics[2]["actor/kl_loss"] > 0  # step 2: the first update moved it
    assert "val-core/openai/gsm8k/reward/mean@1" in metrics[2]

    # the summary's export command turns the last checkpoint into the trained policy's folder
    (line,) = [line for line in result.stdout.splitlines() if "rlcore export" in line]
    command = shlex.split(line[line.index("rlcore export"):])
    assert cli.main(command[1:]) == 0
    exported = dict(AutoModelForCausalLM.from_pretrained(command[-1]).named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model).named_parameters())
    assert exported.keys() == initial.keys()
    assert any(not torch.equal(exported[name], initial[name]) for name in initial)
