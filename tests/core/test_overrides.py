import sys

import attrs
import pytest

from rlcore.api import VerlIgnore, VerlKeys, VerlRefuse, hookimpl
from rlcore.config import load_job
from rlcore.config.overrides import map_verl_key, parse_override, parse_value, verl_mapping
from rlcore.errors import ConfigError, PluginError, RlcoreError
from rlcore.plugins.manager import PluginManager
from tests.conftest import run_rlcore

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# Every verl key the project promises to accept: (override as a verl user types it, rlcore key, value).
VERL_OVERRIDES = [
    ("data.train_files=/data/gsm8k/train.parquet", "data.train_files", ("/data/gsm8k/train.parquet",)),
    ("data.val_files=/data/gsm8k/test.parquet", "data.val_files", ("/data/gsm8k/test.parquet",)),
    ("data.train_batch_size=256", "data.train_batch_size", 256),
    ("data.max_prompt_length=512", "data.max_prompt_length", 512),
    ("data.max_response_length=256", "data.max_response_length", 256),
    ("actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "model.path", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing=True", "model.enable_gradient_checkpointing", True),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "actor.optim.lr", 1e-6),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor.ppo_mini_batch_size", 64),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor.ppo_micro_batch_size_per_gpu", 4),
    ("actor_rollout_ref.actor.use_kl_loss=True", "actor.use_kl_loss", True),
    ("actor_rollout_ref.actor.kl_loss_coef=0.001", "actor.kl_loss_coef", 0.001),
    ("actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor.kl_loss_type", "low_var_kl"),
    ("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "actor.loss_agg_mode",
     "seq-mean-token-sum-norm"),
    ("actor_rollout_ref.actor.entropy_coeff=0", "actor.entropy_coeff", 0.0),
    ("actor_rollout_ref.rollout.name=hf", "rollout.name", "hf"),
    ("actor_rollout_ref.rollout.n=4", "rollout.n", 4),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "rollout.log_prob_micro_batch_size_per_gpu", 8),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=1", "rollout.tensor_model_parallel_size", 1),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0.4", "rollout.gpu_memory_utilization", 0.4),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "ref.log_prob_micro_batch_size_per_gpu", 4),
    ("critic.optim.lr=1e-5", "critic.optim.lr", 1e-5),
    ("critic.model.path=Qwen/Qwen2.5-0.5B-Instruct", "critic.model.path", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("critic.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu", 4),
    ("algorithm.adv_estimator=grpo", "algorithm.adv_estimator", "grpo"),
    ("algorithm.use_kl_in_reward=False", "algorithm.use_kl_in_reward", False),
    ("algorithm.kl_ctrl.kl_coef=0.001", "algorithm.kl_ctrl.kl_coef", 0.001),
    ("trainer.logger=['console','wandb']", "trainer.logger", ("console", "wandb")),
    ("trainer.val_before_train=False", "trainer.val_before_train", False),
    ("trainer.n_gpus_per_node=1", "trainer.n_gpus_per_node", 1),
    ("trainer.nnodes=1", "trainer.nnodes", 1),
    ("trainer.save_freq=10", "trainer.save_freq", 10),
    ("trainer.test_freq=10", "trainer.test_freq", 10),
    ("trainer.total_epochs=15", "trainer.total_epochs", 15),
    ("trainer.total_training_steps=100", "trainer.total_training_steps", 100),
    ("trainer.project_name=verl_examples", "trainer.project_name", "verl_examples"),
    ("trainer.experiment_name=gsm8k", "trainer.experiment_name", "gsm8k"),
    ("trainer.val_only=True", "trainer.val_only", True),
    ("trainer.log_val_generations=10", "trainer.log_val_generations", 10),
    ("trainer.rollout_data_dir=/tmp/rollouts", "trainer.rollout_data_dir", "/tmp/rollouts"),
    ("trainer.validation_data_dir=/tmp/val", "trainer.validation_data_dir", "/tmp/val"),
    ("trainer.max_actor_ckpt_to_keep=2", "trainer.max_ckpt_to_keep", 2),
    ("trainer.max_critic_ckpt_to_keep=2", "trainer.max_ckpt_to_keep", 2),
    ("trainer.resume_mode=resume_path", "trainer.resume_mode", "resume_path"),
    ("actor_rollout_ref.actor.strategy=megatron", "trainer.backend", "megatron"),  # agrees with model_engine
    ("critic.strategy=megatron", "trainer.backend", "megatron"),
    ("trainer.resume_from_path=/ckpt/global_step_40", "trainer.resume_from_path", "/ckpt/global_step_40"),
    ("actor_rollout_ref.model.lora_rank=32", "model.lora_rank", 32),
    ("actor_rollout_ref.model.lora_alpha=32", "model.lora_alpha", 32.0),
    ("actor_rollout_ref.model.target_modules=all-linear", "model.target_modules", ("all-linear",)),
    ("actor_rollout_ref.model.target_modules=[q_proj,v_proj]", "model.target_modules", ("q_proj", "v_proj")),
    ("trainer.logger=[console,wandb]", "trainer.logger", ("console", "wandb")),
    ("critic.model.lora_rank=8", "critic.model.lora_rank", 8),
    ("reward.custom_reward_function.path=my_reward.py", "reward.custom_reward_function.path", "my_reward.py"),
    ("reward.custom_reward_function.name=my_score", "reward.custom_reward_function.name", "my_score"),
    ("custom_reward_function.path=other.py", "reward.custom_reward_function.path", "other.py"),
    ("custom_reward_function.name=other_score", "reward.custom_reward_function.name", "other_score"),
    ("model_engine=megatron", "trainer.backend", "megatron"),
]

# verl keys that land in a section an installed plugin owns: (override, section, option, value).
PLUGIN_VERL_OVERRIDES = [
    ("actor_rollout_ref.ref.fsdp_config.param_offload=True", "ref.fsdp", "param_offload", True),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", "actor.fsdp", "optimizer_offload", True),
    ("critic.model.fsdp_config.reshard_after_forward=False", "critic.fsdp", "reshard_after_forward", False),
]


def value_at(config, dotted):
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("override, key, expected", VERL_OVERRIDES, ids=[o[0].split("=")[0] for o in VERL_OVERRIDES])
def test_each_verl_key_lands_on_its_rlcore_key(override, key, expected):
    job = load_job(None, [override], manager=PluginManager(autoload=False), check=False)
    assert value_at(job.config, key) == expected


@pytest.mark.parametrize("override, section, option, expected", PLUGIN_VERL_OVERRIDES,
                         ids=[o[0].split("=")[0] for o in PLUGIN_VERL_OVERRIDES])
def test_verl_keys_land_in_the_sections_their_plugins_register(override, section, option, expected):
    job = load_job(None, [override], manager=PluginManager(), check=False)
    assert getattr(job.config.section(section), option) == expected


def test_the_mapping_is_noted_once_per_key_used():
    job = load_job(None, ["actor_rollout_ref.actor.optim.lr=2e-6", "data.train_batch_size=8"],
                   manager=PluginManager(autoload=False), check=False)
    assert job.notes == ("verl key actor_rollout_ref.actor.optim.lr -> actor.optim.lr = 2e-06",)


@pytest.mark.parametrize("raw, expected", [
    ("1e-6", 1e-6), ("3", 3), ("true", True), ("True", True), ("False", False), ("'x'", "x"),
    ('["a","b"]', ["a", "b"]), ("plain/path.parquet", "plain/path.parquet"), ("null", None),
    ("{a = 1}", {"a": 1}), ("[q_proj, v_proj]", ["q_proj", "v_proj"]), ("[1,x]", [1, "x"]), ("[]", []),
])
def test_values_are_toml_literals(raw, expected):
    assert parse_value(raw) == expected


def test_a_string_field_keeps_the_text_of_a_number():
    assert parse_override("trainer.experiment_name=2024").value == "2024"
    assert parse_override("trainer.total_epochs=2024").value == 2024


def test_malformed_override_is_a_config_error():
    with pytest.raises(ConfigError, match="expected key.path=value"):
        parse_override("trainer.total_epochs")


def test_override_of_a_value_as_a_table_is_reported():
    with pytest.raises(ConfigError, match="trainer.total_epochs.x: cannot set it, trainer.total_epochs is a value"):
        load_job(None, ["trainer.total_epochs=3", "trainer.total_epochs.x=1"],
                 manager=PluginManager(autoload=False), check=False)


def test_unknown_verl_key_names_the_override():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor_rollout_ref.rollout.enable_chunked_prefil=True"],
                 manager=PluginManager(autoload=False), check=False)
    (problem,) = info.value.problems
    assert problem.startswith("rollout.enable_chunked_prefil: unknown key")
    assert "from override 'actor_rollout_ref.rollout.enable_chunked_prefil=True'" in problem


def test_overrides_win_over_the_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[actor.optim]\nlr = 1e-5\n")
    job = load_job(path, ["actor.optim.lr=2e-5"], manager=PluginManager(autoload=False), check=False)
    assert job.config.actor.optim.lr == 2e-5


def test_verl_names_map_only_where_spelled_differently():
    assert map_verl_key("data.train_batch_size") is None
    assert map_verl_key("actor_rollout_ref.actor.policy_loss.loss_mode") == "actor.policy_loss"
    assert map_verl_key("actor_rollout_ref.rollout.val_kwargs.temperature") == "rollout.val.temperature"
    assert map_verl_key("actor_rollout_ref.rollout.max_num_seqs") == "rollout.vllm.max_num_seqs"
    assert map_verl_key("actor_rollout_ref.rollout.enforce_eager") == "rollout.vllm.enforce_eager"


def test_config_show_accepts_every_verl_key_and_shows_where_each_landed():
    result = run_rlcore("config", "show", *[o for o, _, _ in VERL_OVERRIDES])
    assert result.returncode == 0, result.stderr
    shown = tomllib.loads(result.stdout)
    last = {key: (override, expected) for override, key, expected in VERL_OVERRIDES}  # the last one wins
    for key, (override, expected) in last.items():
        node = shown
        for part in key.split("."):
            node = node[part]
        assert node == (list(expected) if isinstance(expected, tuple) else expected), key
    for override, key, _ in VERL_OVERRIDES:
        verl_key = override.split("=")[0]
        if verl_key != key:
            assert f"note: verl key {verl_key} -> {key}" in result.stderr


def test_two_verl_keys_for_one_setting_must_agree():
    job = load_job(None, ["trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=2"],
                   manager=PluginManager())
    assert job.config.trainer.max_ckpt_to_keep == 2
    with pytest.raises(ConfigError) as error:
        load_job(None, ["trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=3"],
                 manager=PluginManager())
    assert ("trainer.max_ckpt_to_keep: 'trainer.max_actor_ckpt_to_keep=2' and 'trainer.max_critic_ckpt_to_keep=3' "
            "both set it") in str(error.value)


def test_verl_keys_without_a_counterpart_are_ignored_with_a_warning_naming_the_category():
    job = load_job(None, ["data.dataloader_num_workers=8", "actor_rollout_ref.actor.use_liger=True",
                          "actor_rollout_ref.actor.profiler.enable=True", "data.train_batch_size=8"],
                   manager=PluginManager(autoload=False), check=False)
    assert job.config.data.train_batch_size == 8
    assert [w.split(":")[0] for w in job.warnings] == [
        "verl key data.dataloader_num_workers is ignored (machinery",
        "verl key actor_rollout_ref.actor.use_liger is ignored (tuning",
        "verl key actor_rollout_ref.actor.profiler.enable is ignored (profiler"]


def _load(*overrides):
    return load_job(None, list(overrides), manager=PluginManager(), check=False)


@pytest.mark.parametrize("overrides, expected", [
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"],
     dict(rollout_is=True, rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=2.0)),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_threshold=0.5_5.0"],
     dict(rollout_is=True, rollout_is_level="sequence", rollout_is_threshold=5.0, rollout_is_threshold_lower=0.5)),
    (["algorithm.rollout_correction.rollout_is=null", "algorithm.rollout_correction.rollout_is_threshold=2.0"],
     dict(rollout_is=False, rollout_is_threshold=2.0)),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
      "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"],
     dict(rollout_is=True, rollout_is_level="sequence", rollout_is_mode="truncate", rollout_is_threshold=2.0,
          rollout_rs_criteria={"seq_mean_k1": [0.5, 2.0]})),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1",
      "algorithm.rollout_correction.rollout_rs_threshold=4.0", "algorithm.rollout_correction.bypass_mode=False"],
     dict(rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=2.0,
          rollout_rs_criteria={"token_k1": 4.0}, rollout_bypass=False)),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_batch_normalize=true"],
     dict(rollout_is=True, rollout_is_level="sequence", rollout_is_batch_normalize=True, rollout_is_threshold=2.0)),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_rs=token_k1",
      "algorithm.rollout_correction.rollout_rs_threshold=0.6_1.6", "algorithm.rollout_correction.rollout_is_threshold=2.0"],
     dict(rollout_is=True, rollout_is_level="sequence", rollout_is_mode="truncate", rollout_is_threshold=2.0,
          rollout_rs_criteria={"token_k1": [0.6, 1.6]})),
    (["algorithm.rollout_correction.rollout_rs=seq_max_k3", "algorithm.rollout_correction.rollout_rs_threshold=0.01"],
     dict(rollout_is=False, rollout_is_threshold=2.0, rollout_rs_criteria={"seq_max_k3": 0.01})),
    (["algorithm.rollout_correction.bypass_mode=True"], dict(rollout_bypass=True, rollout_is=False)),
    # verl's examples/rollout_correction/run_qwen2_5_7b_fsdp.sh (RLOO, REINFORCE with sequence weights)
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is_threshold=2.0",
      "algorithm.rollout_correction.rollout_is_batch_normalize=true", "algorithm.rollout_correction.rollout_rs=null",
      "algorithm.rollout_correction.rollout_rs_threshold=null", "algorithm.rollout_correction.bypass_mode=true",
      "algorithm.rollout_correction.loss_type=reinforce"],
     dict(rollout_bypass=True, rollout_bypass_loss="reinforce", rollout_is=True, rollout_is_level="sequence",
          rollout_is_mode="truncate", rollout_is_threshold=2.0, rollout_is_batch_normalize=True,
          rollout_rs_criteria=None)),
    # ... and run_qwen2_5_7b_fsdp_multi_rs.sh (bypass PPO-clip, two rejection criteria)
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0",
      "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
      "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'", "algorithm.rollout_correction.bypass_mode=true",
      "algorithm.rollout_correction.loss_type=ppo_clip"],
     dict(rollout_bypass=True, rollout_bypass_loss="ppo_clip", rollout_is=True, rollout_is_level="token",
          rollout_rs_criteria={"token_k1": [0.6, 1.6], "seq_max_k2": 2.5})),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0.5_2.0"],
     dict(rollout_is=True, rollout_is_mode="mask", rollout_is_threshold=2.0, rollout_is_threshold_lower=0.5)),
])
def test_todays_rollout_correction_keys_land_on_rlcores_rollout_is(overrides, expected):
    algorithm = _load(*overrides).config.algorithm
    assert {key: getattr(algorithm, key) for key in expected} == expected


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.rollout_correction.rollout_rs=token_k1"], "rollout_rs_threshold: rollout_rs=token_k1 needs its bounds"),
    (["algorithm.rollout_correction.rollout_rs=token_k9", "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
     "rollout_rs: unknown criterion 'token_k9'"),
    (["algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2,token_k3'",
      "algorithm.rollout_correction.rollout_rs_threshold='2.0,3.0'"],
     "rollout_rs_threshold: 2 bounds for 3 criteria of rollout_rs"),
    (["algorithm.rollout_correction.rollout_rs=seq_max_k2", "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"],
     "rollout_rs.seq_max_k2: expected a positive number (the upper bound of the divergence)"),
    (["algorithm.rollout_correction.rollout_is=True"], "rollout_is: expected token, sequence or null"),
    (["algorithm.rollout_correction.loss_type=ppo"], "loss_type: expected ppo_clip or reinforce, got 'ppo'"),
])
def test_rollout_correction_settings_rlcore_cannot_do_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        _load(*overrides)
    assert message in str(info.value) and "algorithm.rollout_correction." in str(info.value)


def test_todays_lora_and_reward_model_keys_and_the_older_ones_with_a_note():
    job = _load("actor_rollout_ref.model.lora.rank=16", "actor_rollout_ref.model.lora.alpha=32",
                "actor_rollout_ref.model.lora.target_modules=[q_proj,v_proj]", "reward.reward_model.enable=True",
                "reward.reward_model.model_path=/models/rm", "critic.model.lora.rank=4")
    config = job.config
    assert (config.model.lora_rank, config.model.lora_alpha, config.model.target_modules) == (16, 32.0,
                                                                                              ("q_proj", "v_proj"))
    assert (config.reward.model.enable, config.reward.model.path, config.critic.model.lora_rank) == (
        True, "/models/rm", 4)
    old = _load("actor_rollout_ref.model.lora_rank=16", "reward_model.enable=True")
    assert old.config.model.lora_rank == 16 and old.config.reward.model.enable
    assert ("actor_rollout_ref.model.lora_rank is verl's older name; today's is actor_rollout_ref.model.lora.rank"
            in old.notes)
    assert "reward_model.enable is verl's older name; today's is reward.reward_model.enable" in old.notes


@pytest.mark.parametrize("key", ["reward.reward_manager.name", "reward_model.reward_manager"])
@pytest.mark.parametrize("name", ["naive", "dapo", "prime", "gdpo"])
def test_reward_managers_rlcores_reward_does_are_accepted_with_a_warning(key, name):
    job = _load(f"{key}={name}")
    assert job.warnings[0].startswith(f"verl key {key} is ignored (as-rlcore: ")


@pytest.mark.parametrize("key", ["reward.reward_manager.name", "reward_model.reward_manager"])
def test_the_batch_reward_manager_calls_the_function_with_lists(key):
    job = _load(f"{key}=batch", "reward.custom_reward_function.path=my.py")
    assert job.config.reward.custom_reward_function.batch is True
    with pytest.raises(ConfigError,
                       match="unknown reward manager 'mine'; rlcore does naive, dapo, prime, gdpo and batch"):
        _load(f"{key}=mine")


def test_verls_gdpo_keys_land_on_rlcores_gdpo_settings():
    job = _load("algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=['accuracy_reward', 'format_reward']",
                "+algorithm.gdpo_reward_weights=[1.0, 0.5]", "reward.reward_manager.name=gdpo")
    algorithm = job.config.algorithm
    assert (algorithm.adv_estimator, algorithm.gdpo_reward_keys, algorithm.gdpo_reward_weights) == (
        "gdpo", ("accuracy_reward", "format_reward"), (1.0, 0.5))
    assert "other keys of the dict it returns stay in the batch" in job.warnings[0]


def test_verls_top_level_reward_keys_do_not_fall_into_rlcores_reward_table():
    job = _load("reward.num_workers=8", "reward.reward_manager.source=register")
    assert [w.split(" (")[0] for w in job.warnings] == ["verl key reward.reward_manager.source is ignored"]
    assert job.config.reward.num_workers == 8  # verl's reward worker count is rlcore's own setting
    with pytest.raises(ConfigError, match="reward.reward_manager.module.path='my.py' is refused: register"):
        _load("reward.reward_manager.module.path=my.py")


def test_vllm_and_sglang_options_from_verls_rollout_keys():
    job = _load("actor_rollout_ref.rollout.enable_chunked_prefill=False", "actor_rollout_ref.rollout.seed=7",
                "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
                "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
                "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton")
    vllm = job.config.section("rollout.vllm")
    assert (vllm.enable_chunked_prefill, vllm.seed, vllm.logprobs_mode, vllm.engine_kwargs) == (
        False, 7, "raw_logprobs", {"swap_space": 4})
    assert job.config.section("rollout.sglang").engine_kwargs == {"attention_backend": "triton"}


def test_megatron_recompute_from_verls_transformer_config_overrides():
    job = _load("actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
                "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=block",
                "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=2")
    from rlcore_megatron.options import recompute_kwargs

    options = job.config.section("actor.megatron")
    assert recompute_kwargs(options, gradient_checkpointing=False) == {
        "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2}
    assert recompute_kwargs(job.config.section("ref.megatron"), gradient_checkpointing=True)["recompute_method"] == \
        "uniform"
    with pytest.raises(ConfigError, match="selective recompute is not implemented"):
        _load("actor_rollout_ref.actor.megatron.override_transformer_config.recompute_modules=[mlp]")


def test_verls_ulysses_and_torch_compile_keys_land_on_the_fsdp_settings():
    config = _load("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2",
                   "actor_rollout_ref.actor.use_torch_compile=True").config
    assert (config.actor.ulysses_sequence_parallel_size, config.ref.ulysses_sequence_parallel_size,
            config.critic.ulysses_sequence_parallel_size, config.actor.use_torch_compile) == (2, 2, 2, True)
    assert _load("actor_rollout_ref.actor.fsdp_config.use_torch_compile=False").config.actor.use_torch_compile is False


def test_verls_fsdp2_strategy_is_the_fsdp_backend():
    """The fsdp plugin declares the value map (verl's fsdp2 is its backend), not the core."""
    job = load_job(None, ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2",
                          "critic.strategy=fsdp"], manager=PluginManager(), check=False)
    assert job.config.trainer.backend == "fsdp"
    core_only = load_job(None, ["actor_rollout_ref.actor.strategy=fsdp2"], manager=PluginManager(autoload=False),
                         check=False)
    assert core_only.config.trainer.backend == "fsdp2"


@attrs.frozen
class TurboOptions:
    depth: int = 1


class TurboPlugin:
    """A third party's backend section and the verl keys it claims (the longest prefix winning), and the
    verl trainer configs (``--config-name``) that choose it."""

    def __init__(self, aliases=(), values=None, rules=(), config_names=None):
        self.verl_keys = VerlKeys(aliases=aliases, values=values or {}, rules=rules, config_names=config_names or {})

    @hookimpl
    def rlcore_register_config_sections(self, register):
        register("actor.turbo", TurboOptions)

    @hookimpl
    def rlcore_register_verl_keys(self, register):
        register("turbo", self.verl_keys)


def test_a_plugin_maps_verl_keys_and_values_onto_its_own_section():
    plugin = TurboPlugin((("actor_rollout_ref.actor.turbo_config.", "actor.turbo."),),
                         {"trainer.backend": {"turbo2": "turbo"}})
    manager = PluginManager(autoload=False, plugins={"turbo": plugin})
    job = load_job(None, ["actor_rollout_ref.actor.turbo_config.depth=3", "model_engine=turbo2"],
                   manager=manager, check=False)
    assert job.config.section("actor.turbo") == TurboOptions(depth=3)
    assert job.config.trainer.backend == "turbo"
    assert "verl key actor_rollout_ref.actor.turbo_config.depth -> actor.turbo.depth = 3" in job.notes


def test_a_plugins_rules_ignore_and_refuse_the_verl_keys_of_its_tables():
    plugin = TurboPlugin((("actor_rollout_ref.actor.turbo_config.", "actor.turbo."),), rules=(
        (("*.turbo_config.warp",), VerlIgnore("tuning", "turbo warps itself")),
        (("*.turbo_config.size",), VerlRefuse("turbo runs at one size", (1,))),
    ))
    manager = PluginManager(autoload=False, plugins={"turbo": plugin})
    job = load_job(None, ["actor_rollout_ref.actor.turbo_config.warp=9", "actor_rollout_ref.actor.turbo_config.size=1"],
                   manager=manager, check=False)
    assert [w.split(":")[0] for w in job.warnings] == [
        "verl key actor_rollout_ref.actor.turbo_config.warp is ignored (tuning",
        "verl key actor_rollout_ref.actor.turbo_config.size is ignored (as-rlcore"]
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor_rollout_ref.actor.turbo_config.size=4"], manager=manager, check=False)
    assert info.value.problems == ["actor_rollout_ref.actor.turbo_config.size=4 is refused: turbo runs at one size"]


def test_without_its_plugin_a_plugins_verl_key_is_an_unknown_key():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor_rollout_ref.actor.fsdp_config.param_offload=True"],
                 manager=PluginManager(autoload=False), check=False)
    (problem,) = info.value.problems
    assert problem.startswith("actor.fsdp_config: unknown key; no installed plugin registers a [actor.fsdp_config] "
                              "section")


def test_a_verl_key_claimed_twice_names_both_claimants():
    plugin = TurboPlugin((("actor_rollout_ref.actor.grad_clip", "actor.turbo.depth"),))
    with pytest.raises(PluginError, match=r"verl key 'actor_rollout_ref.actor.grad_clip' is mapped twice: by the "
                                          r"core and by plugin 'turbo'"):
        verl_mapping(PluginManager(autoload=False, plugins={"turbo": plugin}))


def test_megatron_optimizer_offload_from_verls_two_spellings_builds_megatrons_cpu_offload():
    from rlcore_megatron.options import optimizer_offload_kwargs

    job = _load("actor_rollout_ref.actor.megatron.optimizer_offload=True",
                "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=0.5",
                "actor_rollout_ref.actor.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d=True",
                "critic.optim.override_optimizer_config.optimizer_cpu_offload=True")
    assert optimizer_offload_kwargs(job.config.section("actor.megatron"), "actor.megatron") == {
        "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5, "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": False}
    assert optimizer_offload_kwargs(job.config.section("critic.megatron"), "critic.megatron")["optimizer_cpu_offload"]
    assert optimizer_offload_kwargs(job.config.section("ref.megatron"), "ref.megatron") == {}
    alone = _load("actor_rollout_ref.actor.optim.override_optimizer_config.use_precision_aware_optimizer=True")
    with pytest.raises(RlcoreError, match="use_precision_aware_optimizer works with actor.megatron.optimizer_offload"):
        optimizer_offload_kwargs(alone.config.section("actor.megatron"), "actor.megatron")


def test_megatron_param_and_grad_offload_from_verl_land_on_each_roles_table():
    job = _load("actor_rollout_ref.actor.megatron.param_offload=True",
                "actor_rollout_ref.actor.megatron.grad_offload=True",
                "actor_rollout_ref.ref.megatron.param_offload=True", "critic.megatron.grad_offload=True")
    actor, ref, critic = (job.config.section(f"{role}.megatron") for role in ("actor", "ref", "critic"))
    assert (actor.param_offload, actor.grad_offload) == (True, True)
    assert (ref.param_offload, ref.grad_offload) == (True, False)
    assert (critic.param_offload, critic.grad_offload) == (False, True)


def test_lora_merge_is_what_rlcore_does_either_way_and_the_per_role_engine_is_the_backend():
    job = _load("actor_rollout_ref.model.lora.merge=True", "actor_rollout_ref.actor.model_engine=megatron")
    assert job.config.trainer.backend == "megatron"
    assert any(w.startswith("verl key actor_rollout_ref.model.lora.merge is ignored (as-rlcore") for w in job.warnings)


def test_verls_file_logger_is_the_metrics_file_every_run_writes():
    job = _load('trainer.logger=["console","wandb","file"]')
    assert job.config.trainer.logger == ("console", "wandb")
    assert any(w.startswith("verl key trainer.logger 'file' is ignored (as-rlcore") and "metrics.jsonl" in w
               for w in job.warnings)


def _field_paths(cls, prefix: str = ""):
    import typing

    for name, tp in typing.get_type_hints(cls).items():
        if attrs.has(tp):
            yield from _field_paths(tp, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def test_every_rlcore_setting_given_by_its_own_name_is_applied_not_taken_for_a_verl_key():
    """``actor.use_torch_compile=true`` on the command line was dropped with a warning by the rule for verl's
    ``*.use_torch_compile`` (tuning rlcore lacks), so a GPU benchmark of compiled layers ran eager, twice
    (2026-12-06); the file's [actor] table set it all along."""
    job = load_job(None, ["actor.use_torch_compile=true"])
    assert job.config.actor.use_torch_compile is True
    assert not [w for w in job.warnings if "use_torch_compile" in w]
    from rlcore.config import verl_keys
    from rlcore.config.overrides import translate_verl
    from rlcore.config.schema import JobConfig

    mapping = verl_mapping()
    swallowed = []
    for path in _field_paths(JobConfig):
        if verl_keys.rule_for(path, mapping.rules) is None:
            continue  # no verl rule matches the name: nothing to take it for
        kept, warnings, _, problems = translate_verl([parse_override(f"{path}=1", mapping)], mapping)
        if [o.key for o in kept] != [path] or warnings or problems:
            swallowed.append(path)
    assert swallowed == []
