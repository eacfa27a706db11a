"""A 2-step GRPO job on `rlcore data shapes` images with a tiny Qwen2-VL-shaped model: the hf engine generates
with the images and the fsdp actor and reference train on them, through `rlcore train` in the job's own
process (trainer.ray = false); under Ray with two workers; and in both asynchronous forms, whose rollout
workers generate with the images on a copy of the model of their own."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_rlcore
from tests.e2e.conftest import checkpoint_tensors, job_overrides, parity_reward, read_metrics, train

TIMEOUT_S = 120  # measured: about 20 s on the 2-core CI machine


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    from rlcore.testing import build_tiny_vision_model

    return build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-qwen2-vl")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    result = run_rlcore("data", "shapes", "--local-save-dir", str(out), "--train-size", "8", "--test-size", "4",
                        "--image-size", "56", "--seed", "0", timeout=60)
    assert result.returncode == 0, result.stderr
    return out


def test_grpo_on_images_trains_the_vision_language_model(vision_model, shapes, tmp_path):
    from transformers import AutoModelForImageTextToText

    run = tmp_path / "vlm"
    result = train(*job_overrides(vision_model, shapes, run, **{"data.max_prompt_length": 128}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true",
                   "actor.freeze_vision_tower=true", "model.use_remove_padding=true", timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)  # every value finite
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "val-core/rlcore/shapes/reward/mean@1" in metrics[0]
    for step in metrics[1:]:
        for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "timing_s/ref", "critic/score/mean"):
            assert name in step, name
        assert step["actor/grad_norm"] > 0
        assert step["prompt_length/mean"] > 4  # the image's 4 tokens are in the prompt

    initial = {name: p.detach()
               for name, p in AutoModelForImageTextToText.from_pretrained(vision_model).named_parameters()}
    trained = checkpoint_tensors(run / "global_step_2" / "actor", tmp_path / "scratch" / "actor.pt")
    weights = trained["model"]
    moved = {name for name, value in initial.items() if name in weights and not torch.equal(weights[name], value)}
    vision = {name for name in initial if ".visual." in name}
    assert vision and set(initial) <= set(weights), sorted(set(initial) - set(weights))[:5]
    assert moved and not moved & vision  # the language model trained, the frozen vision tower did not

    # the exported folder is a vision-language model with its image processor, holding the trained weights
    exported = tmp_path / "exported"
    result = run_rlcore("export", str(run / "global_step_2"), "--to", str(exported), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (exported / "preprocessor_config.json").is_file()
    model = AutoModelForImageTextToText.from_pretrained(exported)
    for name, value in model.named_parameters():
        torch.testing.assert_close(value.detach(), weights[name], atol=0, rtol=0)


def test_a_job_with_images_and_a_critic_is_refused_before_it_starts(vision_model, shapes, tmp_path):
    result = train(*job_overrides(vision_model, shapes, tmp_path / "gae", **{"data.max_prompt_length": 128}),
                   "algorithm.adv_estimator=gae", timeout=60)
    assert result.returncode == 2
    assert "the train data carries images" in result.stderr
    assert "the critic (a value model, for adv_estimator = 'gae') does not take images yet" in result.stderr


def test_two_workers_under_ray_split_the_rows_with_their_images(vision_model, shapes, tmp_path):
    """The default path (trainer.ray = true): each worker generates with and trains on its own rows' images."""
    run = tmp_path / "ray"
    result = train(*job_overrides(vision_model, shapes, run, **{"data.max_prompt_length": 128,
                                                                "trainer.n_gpus_per_node": 2}),
                   "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true",
                   "model.use_remove_padding=true", ray=True, timeout=2 * TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workers: 2 hybrid (actor, rollout, reference)" in result.stdout
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [0, 1, 2] and all(m["actor/grad_norm"] > 0 for m in metrics[1:])


LOSSES = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean",
          "prompt_length/mean")


def test_both_asynchronous_forms_at_staleness_zero_train_on_images_as_lockstep_does(vision_model, shapes, tmp_path):
    """The asynchronous controller carries the rows' images: its rollout workers generate with them (the
    engine's own copy of the vision-language model, its weights sent by the actor) and its trainer trains
    on them. At staleness 0 each form gives lockstep's losses, step by step (it refused images before)."""
    def job(run: str) -> list[str]:
        return [*job_overrides(vision_model, shapes, tmp_path / run, **{
                    "data.max_prompt_length": 128, "trainer.val_before_train": False, "trainer.test_freq": -1,
                    "trainer.save_freq": -1}),
                "algorithm.adv_estimator=grpo", "rollout.n=2", "actor.use_kl_loss=true",
                "model.use_remove_padding=true", *parity_reward(tmp_path)]

    lockstep = train(*job("lockstep"), "async_training.mode=off", timeout=TIMEOUT_S)
    assert lockstep.returncode == 0, lockstep.stdout + lockstep.stderr
    expected = read_metrics(tmp_path / "lockstep")
    assert [m["step"] for m in expected] == [1, 2] and all(m["actor/grad_norm"] > 0 for m in expected)
    for mode in ("split", "colocated"):
        result = train(*job(mode), f"async_training.mode={mode}", "async_training.max_staleness=0", ray=True,
                       timeout=2 * TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        got = read_metrics(tmp_path / mode)
        assert [m["step"] for m in got] == [1, 2], mode
        for a, b in zip(expected, got, strict=True):
            assert b["async/staleness_max"] == 0 and b["async/weight_sync_gb"] > 0
            for key in LOSSES:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (mode, a["step"], key)
