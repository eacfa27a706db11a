"""verl's FSDP2-based engines (VeOmni, FSDP-Turbo) on the fsdp backend, and verl's on-policy
distillation keys on ``[distillation]``: where each key lands, and what is refused."""

import pytest

from rlcore.config import load_job
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager


def _load(*overrides, check=False):
    return load_job(None, list(overrides), manager=PluginManager(), check=check)


def test_veomni_is_the_fsdp_backend_with_its_offload_sharding_and_ulysses_settings():
    job = _load("model_engine=veomni", "actor_rollout_ref.actor.veomni.param_offload=True",
                "actor_rollout_ref.actor.veomni.optimizer_offload=True",
                "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2", "actor_rollout_ref.actor.veomni.fsdp_size=4",
                "actor_rollout_ref.ref.veomni.param_offload=True", "critic.veomni.ulysses_parallel_size=2",
                "actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2")
    config = job.config
    assert config.trainer.backend == "fsdp"
    actor, ref = config.section("actor.fsdp"), config.section("ref.fsdp")
    assert (actor.param_offload, actor.optimizer_offload, actor.fsdp_size, ref.param_offload) == (True, True, 4, True)
    assert (config.actor.ulysses_sequence_parallel_size, config.critic.ulysses_sequence_parallel_size) == (2, 2)
    assert any(w.startswith("verl key actor_rollout_ref.actor.veomni.attn_implementation is ignored (tuning: ")
               for w in job.warnings)


def test_fsdp_turbo_is_the_fsdp_backend_and_its_tensor_parallelism_is_refused():
    turbo = "actor_rollout_ref.actor.fsdp_config.turbo_config"
    job = _load("actor_rollout_ref.actor.strategy=fsdp_turbo", f"{turbo}.distributed.fully_shard_parallel_size=8",
                f"{turbo}.distributed.ulysses_parallel_size=2", f"+{turbo}.memory.recompute=True")
    assert job.config.trainer.backend == "fsdp"
    assert (job.config.section("actor.fsdp").fsdp_size, job.config.actor.ulysses_sequence_parallel_size) == (8, 2)
    with pytest.raises(ConfigError, match="tensor parallelism is trainer.backend=megatron"):
        _load(f"{turbo}.distributed.tensor_parallel_size=2")


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.veomni.expert_parallel_size",
                                 "actor_rollout_ref.ref.fsdp_config.turbo_config.distributed.expert_parallel_size",
                                 "critic.fsdp.turbo_config.distributed.expert_fully_shard_parallel_size"])
def test_expert_parallelism_of_verls_fsdp_engines_warns_that_fsdp_shards_the_experts_instead(key):
    """verl's run_qwen3_5-122b-a10b_veomni.sh and run_qwen3_5_35b_fsdp_turbo.sh: the experts train sharded
    like every other weight (tests/fsdp/test_moe.py checks the log-probs and the step on 2 ranks)."""
    job = _load(f"{key}=8", check=True)
    assert job.config.trainer.backend == "fsdp"
    (warning,) = [w for w in job.warnings if key in w]
    assert warning.startswith(f"verl key {key} is ignored (tuning: ")
    assert "experts included, sharded over the FSDP ranks" in warning and "the same log-probs and updates" in warning


def test_verls_distillation_keys_land_on_the_distillation_table():
    settings = _load("distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/m/teacher",
                     "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_task_rewards=False",
                     "distillation.distillation_loss.use_policy_gradient=True",
                     "distillation.distillation_loss.distillation_loss_coef=0.5",
                     "distillation.distillation_loss.loss_max_clamp=10.0",
                     "distillation.distillation_loss.log_prob_min_clamp=-10.0",
                     "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
                     "distillation.n_gpus_per_node=4").config.distillation
    assert (settings.enable, settings.teacher_path, settings.loss, settings.use_task_rewards,
            settings.use_policy_gradient, settings.coef, settings.loss_max_clamp, settings.log_prob_min_clamp) == (
        True, "/m/teacher", "k1", False, True, 0.5, 10.0, -10.0)


def test_one_teacher_under_a_name_of_its_own_is_the_teacher_and_several_need_their_data_sources():
    job = _load("distillation.enabled=True", "+distillation.teacher_models.gsm8k.key=openai/gsm8k",
                "+distillation.teacher_models.gsm8k.model_path=/m/teacher",
                "+distillation.teacher_models.gsm8k.inference.tensor_model_parallel_size=1")
    assert job.config.distillation.teacher_path == "/m/teacher"
    assert any("rlcore's one teacher scores every sample" in note for note in job.notes)
    with pytest.raises(ConfigError, match=r"give each teacher a key \(the data_source of its samples\) and a "
                                          r"model_path"):
        _load("+distillation.teacher_models.gsm8k.model_path=/m/a", "+distillation.teacher_models.geo3k.model_path=/m/b")


def test_several_teachers_become_one_teacher_per_data_source():
    """verl's run_qwen3_8b_mopd_fsdp.sh: a gsm8k and a geo3k teacher, each with its inference server."""
    job = _load("distillation.enabled=True", "distillation.teacher_key=data_source",
                *(f"+distillation.teacher_models.{name}.{key}={value}" for name, source, path in (
                    ("gsm8k", "openai/gsm8k", "/m/qwen3-32b"), ("geo3k", "hiyouga/geometry3k", "/m/qwen3-vl-32b"))
                  for key, value in (("key", source), ("model_path", path), ("num_replicas", 1),
                                     ("inference.name", "vllm"), ("inference.tensor_model_parallel_size", 2))),
                check=True)
    settings = job.config.distillation
    assert settings.teachers == {"openai/gsm8k": "/m/qwen3-32b", "hiyouga/geometry3k": "/m/qwen3-vl-32b"}
    assert settings.teacher_path is None
    assert any("distillation.teachers, each scoring the samples of its data_source" in note for note in job.notes)
    ignored = [w for w in job.warnings if "distillation.teacher_models.geo3k.inference.name is ignored (machinery" in w]
    assert len(ignored) == 1
    with pytest.raises(ConfigError, match="give each teacher a key"):  # two teachers for one data source
        _load(*(f"+distillation.teacher_models.{name}.{key}={value}" for name in ("a", "b")
                for key, value in (("key", "openai/gsm8k"), ("model_path", f"/m/{name}"))))


def test_a_distillation_job_needs_a_teacher_and_no_kl_to_the_initial_policy():
    with pytest.raises(ConfigError) as info:
        _load("distillation.enable=true", "actor.use_kl_loss=true", check=True)
    problems = "\n".join(info.value.problems)
    assert "set distillation.teacher_path" in problems
    assert "actor.use_kl_loss (a KL to the initial policy) cannot be on beside it" in problems
    with pytest.raises(ConfigError, match="distillation.loss: unknown kl_estimators name 'forward_kl_top'"):
        _load("distillation.enable=true", "distillation.teacher_path=/m/t", "distillation.loss=forward_kl_top",
              check=True)


def test_verls_top_k_forward_kl_lands_with_its_k_on_fsdp_and_is_refused_where_it_cannot_run():
    """verl's run_qwen3_8b_megatron.sh asks for forward_kl_topk with topk 64 on the megatron backend."""
    verl = ("distillation.enabled=True", "distillation.teacher_models.teacher_model.model_path=/m/teacher",
            "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=64")
    settings = _load(*verl, "model_engine=fsdp", check=True).config.distillation
    assert (settings.loss, settings.topk) == ("forward_kl_topk", 64)
    default = _load("distillation.enable=true", "distillation.teacher_path=/m/t", check=True).config.distillation
    assert default.topk == 32
    with pytest.raises(ConfigError, match=r"distillation.loss = 'forward_kl_topk': the 'megatron' training backend "
                                          r"does not give the teacher's top-k tokens .* use trainer.backend = one "
                                          r"of 'fsdp'"):
        _load(*verl, "model_engine=megatron", check=True)


def test_distillation_alone_needs_no_groups_but_beside_the_task_reward_grpo_still_does():
    alone = ["distillation.enable=true", "distillation.teacher_path=/m/t", "distillation.use_task_rewards=false",
             "algorithm.adv_estimator=grpo", "rollout.n=1"]
    assert not any("compares samples within a group" in w for w in _load(*alone, check=True).warnings)
    beside = _load(*alone[:2], *alone[3:], check=True)
    assert any("compares samples within a group, but rollout.n = 1" in w for w in beside.warnings)


def test_distillation_settings_without_distillation_warn_that_they_do_nothing():
    job = _load("distillation.coef=0.5", check=True)
    assert "distillation.coef has no effect while distillation.enable is false" in job.warnings


def test_the_megatron_lite_engines_short_names_land_on_the_megatron_backend():
    engine = "actor_rollout_ref.actor.engine"
    job = _load("actor@actor_rollout_ref.actor=mlite_actor", f"{engine}.tp=2", f"{engine}.pp=4",
                f"{engine}.optimizer_offload=True", f"{engine}.param_offload=True", f"{engine}.grad_offload=True",
                f"{engine}.impl_cfg.use_thd=True", f"{engine}.cp=2", f"+{engine}.impl_cfg.optimizer=fsdp2")
    config, megatron = job.config, job.config.section("actor.megatron")
    assert config.trainer.backend == "megatron" and config.model.use_remove_padding
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size, megatron.context_parallel_size,
            megatron.optimizer_offload, megatron.param_offload, megatron.grad_offload) == (2, 4, 2, True, True, True)


def test_megatron_lites_full_recompute_recomputes_every_whole_layer_and_selective_is_refused():
    from rlcore_megatron.options import recompute_kwargs

    recompute = "+actor_rollout_ref.actor.engine.impl_cfg.recompute"
    for full in ("[full]", "full"):
        options = _load(f"{recompute}={full}").config.section("actor.megatron")
        assert options.recompute_granularity == "full"
        # what megatron-core's TransformerConfig is given: each layer recomputed in its backward pass
        assert recompute_kwargs(options, gradient_checkpointing=False) == {
            "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    for nothing in ("[]", "none"):
        options = _load(f"{recompute}={nothing}").config.section("actor.megatron")
        assert recompute_kwargs(options, gradient_checkpointing=False) == {}
    for selective in ("[core_attn]", "[full,mlp]", "[moe,router]"):
        with pytest.raises(ConfigError, match="selective recompute. is not implemented"):
            _load(f"{recompute}={selective}")


def test_verls_checkpoint_contents_land_on_the_roles_and_the_legacy_worker_switch_is_machinery():
    job = _load("actor_rollout_ref.actor.checkpoint.save_contents=[model,extra,optimizer]",
                "critic.checkpoint.save_contents=['model']", "+trainer.use_legacy_worker_impl=disable",
                "actor_rollout_ref.actor.checkpoint.load_contents=${.save_contents}")
    assert job.config.actor.checkpoint.save_contents == ("model", "extra", "optimizer")
    assert job.config.critic.checkpoint.save_contents == ("model",)
    assert any(w.startswith("verl key trainer.use_legacy_worker_impl is ignored (machinery: ") for w in job.warnings)
    with pytest.raises(ConfigError, match=r"actor.checkpoint.save_contents = \['optimizer'\] has no 'model': an "
                                          "rlcore checkpoint is what a run resumes from"):
        _load("actor_rollout_ref.actor.checkpoint.save_contents=[optimizer]", check=True)
    with pytest.raises(ConfigError, match=r"critic.checkpoint.save_contents: unknown part\(s\) \['weights'\]"):
        _load("critic.checkpoint.save_contents=[model,weights]", check=True)
    with pytest.raises(ConfigError, match="rlcore loads what a checkpoint holds"):
        _load("actor_rollout_ref.actor.checkpoint.load_contents=[model]")


def test_megatron_fsdp_is_memory_tuning_ignored_with_its_reason():
    job = _load("actor_rollout_ref.actor.megatron.use_megatron_fsdp=True")
    (warning,) = [w for w in job.warnings if "use_megatron_fsdp" in w]
    assert warning.startswith("verl key actor_rollout_ref.actor.megatron.use_megatron_fsdp is ignored (tuning: ")
    assert "the same updates" in warning
