"""verl's keys for the inference engine's layout (data and expert parallelism, quantization), the HF
config override and the vision patch size: where each lands, what is checked, what is refused."""

import pytest

from rlcore.config import load_job
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager

ROLLOUT = "actor_rollout_ref.rollout"


def _load(*overrides, check=True):
    return load_job(None, list(overrides), manager=PluginManager(), check=check)


def test_a_moe_scripts_rollout_layout_lands_on_the_rollout_table():
    """verl's run_qwen3_30b_veomni.sh: 8 workers, one engine of 8 data-parallel ranks with 8-way experts."""
    job = _load("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "data.train_batch_size=8", "rollout.name=vllm", f"{ROLLOUT}.data_parallel_size=8",
                f"{ROLLOUT}.expert_parallel_size=8", f"{ROLLOUT}.tensor_model_parallel_size=1",
                f"{ROLLOUT}.quantization=fp8")
    rollout = job.config.rollout
    assert (rollout.data_parallel_size, rollout.expert_parallel_size, rollout.quantization) == (8, 8, "fp8")
    assert not [w for w in job.warnings if "data_parallel_size" in w or "quantization" in w]


def test_experts_split_over_all_the_engines_ranks_or_none():
    base = ("trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.train_batch_size=8")
    _load(*base, f"{ROLLOUT}.tensor_model_parallel_size=2", f"{ROLLOUT}.data_parallel_size=2",
          f"{ROLLOUT}.expert_parallel_size=4")
    with pytest.raises(ConfigError, match=r"rollout.expert_parallel_size \(2\) must be 1 or tensor_model_parallel_size "
                                          r"x data_parallel_size \(2 x 2 = 4\)"):
        _load(*base, f"{ROLLOUT}.tensor_model_parallel_size=2", f"{ROLLOUT}.data_parallel_size=2",
              f"{ROLLOUT}.expert_parallel_size=2")
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size x data_parallel_size \(4 x 4\) cannot exceed "
                                          r"the number of workers \(8\)"):
        _load(*base, f"{ROLLOUT}.tensor_model_parallel_size=4", f"{ROLLOUT}.data_parallel_size=4")


def test_pipeline_stages_and_a_quantization_file_stay_refused_with_what_to_use():
    with pytest.raises(ConfigError, match="not by pipeline stages"):
        _load(f"{ROLLOUT}.pipeline_model_parallel_size=2", check=False)
    with pytest.raises(ConfigError, match="set the method in rollout.quantization"):
        _load(f"{ROLLOUT}.quantization_config_file=q.json", check=False)


def test_the_image_keys_are_read_and_the_other_vision_model_keys_are_refused():
    job = _load("data.image_patch_size=16", "data.image_key=frames",
                "actor_rollout_ref.actor.freeze_vision_tower=true", check=False)
    assert job.config.data.image_key == "frames" and job.config.actor.freeze_vision_tower
    (warning,) = [w for w in job.warnings if "image_patch_size" in w]
    assert warning.startswith("verl key data.image_patch_size is ignored (feature-off: ")
    assert "rlcore reads it from the model folder's preprocessor_config.json" in warning
    for key in ("data.video_key=clips", "actor_rollout_ref.rollout.limit_images=2"):
        with pytest.raises(ConfigError, match="rlcore's vision-language training takes images only"):
            _load(key, check=False)


def test_the_policys_hf_config_override_lands_on_model_override_config():
    """verl's run_qwen3_vl_30b_moe_veomni.sh sets actor_rollout_ref.model.override_config.max_position_embeddings."""
    job = _load("actor_rollout_ref.model.override_config.max_position_embeddings=32768",
                "+actor_rollout_ref.model.override_config.text_config.rope_theta=1000000.0")
    assert job.config.model.override_config == {"max_position_embeddings": 32768,
                                                "text_config": {"rope_theta": 1000000.0}}
    with pytest.raises(ConfigError, match="edit the critic model folder's config.json"):
        _load("critic.model.override_config.max_position_embeddings=32768", check=False)


def test_a_backend_that_does_not_apply_the_override_is_refused():
    with pytest.raises(ConfigError, match=r"model.override_config: the 'megatron' training backend does not set "
                                          r"config values over the model's; use trainer.backend = one of .*'fsdp'"):
        _load("trainer.backend=megatron", "actor_rollout_ref.model.override_config.max_position_embeddings=64")
