import sys

import attrs
import pytest

from rlcore import hookimpl
from rlcore.api import PolicyLoss
from rlcore.config import load_job
from rlcore.config.dump import to_toml
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager
from tests.conftest import run_rlcore

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@attrs.frozen
class EngineOptions:
    max_num_seqs: int = 256
    enforce_eager: bool = False


@attrs.frozen
class Named:
    """A registered value for tests of name resolution; the config layer only checks names."""

    needs_critic: bool = False
    needs_groups: bool = False


class SectionPlugin:
    @hookimpl
    def rlcore_register_config_sections(self, register):
        register("rollout.fast", EngineOptions)


# Names a default job refers to; registered here only where no core plugin provides them yet, so these
# tests check the config layer without depending on the backends. The first backend and engine are
# declared the defaults, as their plugins do.
NEEDED = {
    "training_backends": ("fsdp",),
    "rollout_engines": ("hf",),
    "advantage_estimators": ("gae", "grpo"),
    "policy_losses": ("vanilla",),
    "kl_estimators": ("kl", "low_var_kl"),
    "loggers": ("console",),
}


class NamesPlugin:
    def __init__(self, missing: dict[str, list[str]]):
        self.missing = missing

    def _register(self, kind, register):
        for name in self.missing.get(kind, ()):
            default = kind in ("training_backends", "rollout_engines") and name == NEEDED[kind][0]
            value = (PolicyLoss(lambda *args, **kwargs: None) if kind == "policy_losses"  # the contract, never called
                     else Named(needs_critic=name == "gae", needs_groups=name == "grpo"))
            register(name, value, default=default)

    @hookimpl
    def rlcore_register_training_backends(self, register):
        self._register("training_backends", register)

    @hookimpl
    def rlcore_register_rollout_engines(self, register):
        self._register("rollout_engines", register)

    @hookimpl
    def rlcore_register_advantage_estimators(self, register):
        self._register("advantage_estimators", register)

    @hookimpl
    def rlcore_register_policy_losses(self, register):
        self._register("policy_losses", register)

    @hookimpl
    def rlcore_register_kl_estimators(self, register):
        self._register("kl_estimators", register)

    @hookimpl
    def rlcore_register_loggers(self, register):
        self._register("loggers", register)


def manager():
    core = PluginManager(autoload=False)
    missing = {kind: [n for n in names if n not in core.registry(kind)] for kind, names in NEEDED.items()}
    return PluginManager(autoload=False, plugins={"names": NamesPlugin(missing), "sections": SectionPlugin()})


def write(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def problems_of(path, overrides=(), mgr=None):
    with pytest.raises(ConfigError) as info:
        load_job(path, list(overrides), manager=mgr or manager())
    return info.value.problems


def test_defaults_follow_verl():
    job = load_job(None, [], manager=manager())
    c = job.config
    assert c.algorithm.adv_estimator == "gae" and c.algorithm.gamma == 1.0 and c.algorithm.lam == 1.0
    assert c.actor.clip_ratio == 0.2 and c.actor.clip_ratio_c == 3.0 and c.actor.loss_agg_mode == "token-mean"
    assert c.actor.kl_loss_coef == 0.001 and c.actor.kl_loss_type == "low_var_kl" and not c.actor.use_kl_loss
    assert c.algorithm.kl_ctrl.type == "fixed" and c.algorithm.kl_ctrl.kl_coef == 0.001
    assert c.rollout.n == 1 and c.rollout.temperature == 1.0 and c.actor.ppo_epochs == 1
    assert c.section("rollout.fast") == EngineOptions()


def test_all_problems_reported_together_with_paths(tmp_path):
    path = write(tmp_path, """
[actor]
clip_ratoi = 0.3
ppo_epochs = 1.5
[actor.optim]
lr = -1e-6
[rollout]
do_sample = "false"
""")
    problems = problems_of(path)
    assert 'actor.clip_ratoi: unknown key (did you mean "clip_ratio"?)' in problems
    assert "actor.ppo_epochs: expected an integer, got a float 1.5" in problems
    assert "actor.optim.lr: must be > 0.0, got -1e-06" in problems
    assert "rollout.do_sample: expected a boolean (true or false), got a string 'false'" in problems
    assert len(problems) == 4


def test_a_file_with_four_kinds_of_problem_reports_them_all_in_one_pass(tmp_path):
    """An unknown key and a wrong type (the file cannot be read into settings), a value out of its
    range, and a name no plugin registers and batch sizes that do not divide (the checks of the rest
    of the job, which used to wait for a second run)."""
    path = write(tmp_path, """
[actor]
clip_ratoi = 0.3
ppo_epochs = 1.5
ppo_mini_batch_size = 3
[actor.optim]
lr = -1e-6
[data]
train_batch_size = 8
[algorithm]
adv_estimator = "grpo_plus"
""")
    problems = problems_of(path)
    assert problems[:3] == ['actor.clip_ratoi: unknown key (did you mean "clip_ratio"?)',
                            "actor.ppo_epochs: expected an integer, got a float 1.5",
                            "actor.optim.lr: must be > 0.0, got -1e-06"]
    assert any(p.startswith("algorithm.adv_estimator: unknown advantage_estimators name 'grpo_plus'") for p in problems), problems
    assert "data.train_batch_size (8) must be a multiple of actor.ppo_mini_batch_size (3)" in problems
    assert len(problems) == 5, problems
    result = run_rlcore("config", "validate", str(path))
    assert result.returncode == 2 and all(p in result.stderr for p in problems), result.stderr


@pytest.mark.parametrize("toml, expected", [
    ("[data]\ntrain_batch_size = 10.7", "data.train_batch_size: expected an integer, got a float 10.7"),
    ("[data]\ntrain_batch_size = true", "data.train_batch_size: expected an integer, got a boolean True"),
    ("[actor]\nclip_ratio = true", "actor.clip_ratio: expected a number, got a boolean True"),
    ("[model]\npath = 3", "model.path: expected a string, got an integer 3"),
    ("[actor.optim]\nbetas = [0.9]", "actor.optim.betas: expected an array of 2 numbers, got 1 items [0.9]"),
    ("[trainer]\nlogger = [\"console\", 1]", "trainer.logger[1]: expected a string, got an integer 1"),
    ("[actor]\nloss_agg_mode = \"mean\"", "actor.loss_agg_mode: expected one of 'token-mean', "
     "'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm', got 'mean'"),
    ("actor = 3", "actor: expected a table, got an integer 3"),
    ("[colour]\nx = 1", "colour: unknown key"),
])
def test_strict_types_and_ranges(tmp_path, toml, expected):
    problems = problems_of(write(tmp_path, toml))
    assert any(p.startswith(expected) for p in problems), problems


def test_integers_are_accepted_for_floats_and_a_string_for_a_list(tmp_path):
    job = load_job(write(tmp_path, '[actor]\nclip_ratio = 0\n[data]\ntrain_files = "a.parquet"'), [],
                   manager=manager())
    assert job.config.actor.clip_ratio == 0.0 and isinstance(job.config.actor.clip_ratio, float)
    assert job.config.data.train_files == ("a.parquet",)


def test_plugin_section_is_validated_by_its_class(tmp_path):
    good = load_job(write(tmp_path, "[rollout.fast]\nmax_num_seqs = 8"), [], manager=manager())
    assert good.config.section("rollout.fast") == EngineOptions(max_num_seqs=8)
    problems = problems_of(write(tmp_path, "[rollout.fast]\nmax_num_seq = 8\nenforce_eager = 1"))
    assert 'rollout.fast.max_num_seq: unknown key (did you mean "max_num_seqs"?)' in problems
    assert "rollout.fast.enforce_eager: expected a boolean (true or false), got an integer 1" in problems


def test_unregistered_plugin_section_says_no_plugin_owns_it(tmp_path):
    (problem,) = problems_of(write(tmp_path, "[rollout.vllm]\nx = 1"))
    assert problem.startswith("rollout.vllm: unknown key; no installed plugin registers a [rollout.vllm] section")
    assert "[rollout.fast]" in problem


def test_cross_field_checks_name_the_fields():
    problems = problems_of(None, ["data.train_batch_size=6", "actor.ppo_mini_batch_size=4"])
    assert any("data.train_batch_size (6) must be a multiple of actor.ppo_mini_batch_size (4)" in p
               for p in problems)
    problems = problems_of(None, ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                                  "rollout.n=3", "trainer.n_gpus_per_node=8"])
    assert any("(4 x 3 = 12) must divide evenly over trainer.n_gpus_per_node x trainer.nnodes (8)" in p
               for p in problems)
    problems = problems_of(None, ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                                  "rollout.n=2", "actor.ppo_micro_batch_size_per_gpu=3"])
    assert any("actor.ppo_micro_batch_size_per_gpu (3)" in p for p in problems)


def test_groups_needed_but_n_is_one_warns_that_each_sample_keeps_its_raw_score():
    job = load_job(None, ["algorithm.adv_estimator=grpo", "rollout.n=1", "data.train_batch_size=4",
                          "actor.ppo_mini_batch_size=4"], manager=manager())
    assert any(w.startswith("algorithm.adv_estimator = 'grpo' compares samples within a group, but rollout.n = 1: "
                            "each sample is a group of its own, whose advantage is its raw score") for w in job.warnings)


def test_unknown_names_list_registered_ones():
    problems = problems_of(None, ["rollout.name=vlm", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"])
    assert any(p.startswith("rollout.name: unknown rollout_engines name 'vlm'") and "registered: hf" in p
               for p in problems)


def test_settings_without_effect_warn():
    job = load_job(None, ["actor.kl_loss_coef=0.1", "algorithm.kl_ctrl.kl_coef=0.2", "critic.optim.lr=1e-4",
                          "algorithm.adv_estimator=grpo", "rollout.n=2",
                          "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"], manager=manager())
    assert "actor.kl_loss_coef has no effect while actor.use_kl_loss is false" in job.warnings
    assert "algorithm.kl_ctrl.kl_coef has no effect while algorithm.use_kl_in_reward is false" in job.warnings
    assert any(w.startswith("critic.optim.lr has no effect: algorithm.adv_estimator = 'grpo'") for w in job.warnings)


def test_a_custom_reward_function_name_without_its_path_warns():
    job = load_job(None, ["reward.custom_reward_function.name=my_score", "data.train_batch_size=4",
                          "actor.ppo_mini_batch_size=4"], manager=manager())
    assert any(w.startswith("reward.custom_reward_function.name has no effect without reward.custom_reward_function"
                            ".path") for w in job.warnings), job.warnings


def test_rollout_importance_sampling_settings_are_checked():
    job = load_job(None, ["algorithm.rollout_is=true", "algorithm.rollout_is_mode=mask"], manager=manager())
    assert "algorithm.rollout_is has no effect while algorithm.rollout_is_threshold is unset" in job.warnings
    assert "algorithm.rollout_is_mode has no effect while algorithm.rollout_is_threshold is unset" in job.warnings
    problems = problems_of(None, ["algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is_threshold_lower=3.0"])
    assert any(p.startswith("algorithm.rollout_is_threshold_lower = 3.0 is above algorithm.rollout_is_threshold")
               for p in problems)
    assert any("algorithm.rollout_is_threshold: must be > 0" in p
               for p in problems_of(None, ["algorithm.rollout_is_threshold=0"]))
    problems = problems_of(None, ["algorithm.rollout_is_threshold=2.0",
                                  "actor_rollout_ref.rollout.calculate_log_probs=false"])  # verl's key
    assert any("rollout.calculate_log_probs must be true" in p for p in problems)


def test_gdpo_settings_are_checked():
    problems = problems_of(None, ["algorithm.adv_estimator=gdpo", "rollout.n=4"])
    assert any(p.startswith("algorithm.adv_estimator = 'gdpo' normalises each reward component on its own: set "
                            "algorithm.gdpo_reward_keys") for p in problems)
    problems = problems_of(None, ["algorithm.adv_estimator=gdpo", "rollout.n=4", "algorithm.gdpo_reward_keys=['a']",
                                  "algorithm.gdpo_reward_weights=[1.0, 2.0]"])
    assert "algorithm.gdpo_reward_weights has 2 weight(s) for 1 key(s) of algorithm.gdpo_reward_keys: give one per " \
           "key" in problems
    job = load_job(None, ["algorithm.adv_estimator=grpo", "rollout.n=4", "algorithm.gdpo_reward_keys=['a']"],
                   manager=manager())
    assert ("algorithm.gdpo_reward_keys has no effect: algorithm.adv_estimator = 'grpo' reads the summed score"
            in job.warnings)


def test_the_optimal_token_baseline_needs_the_sum_of_squared_probabilities_and_an_old_log_prob_pass():
    otb = ["algorithm.adv_estimator=optimal_token_baseline", "rollout.n=4"]
    assert any(p.startswith("algorithm.adv_estimator = 'optimal_token_baseline' weighs each position by "
                            "1 - 2 pi + sum pi^2") and p.endswith("set actor.calculate_sum_pi_squared = true")
               for p in problems_of(None, otb))
    problems = problems_of(None, [*otb, "actor.calculate_sum_pi_squared=true", "algorithm.rollout_bypass=true"])
    assert any(p.startswith("actor.calculate_sum_pi_squared comes from the old log-prob pass, which bypass mode")
               for p in problems)
    job = load_job(None, [*otb, "actor_rollout_ref.actor.calculate_sum_pi_squared=true"], manager=manager(),
                   check=False)
    assert job.config.actor.calculate_sum_pi_squared


def test_verl_reward_model_keys_land_in_reward_model_and_need_a_path():
    job = load_job(None, ["reward_model.enable=true", "reward_model.model.path=/models/rm",
                          "reward_model.micro_batch_size_per_gpu=8"], manager=manager())
    model = job.config.reward.model
    assert (model.enable, model.path, model.micro_batch_size_per_gpu) == (True, "/models/rm", 8)
    assert any("a reward model needs reward.model.path" in p for p in problems_of(None, ["reward_model.enable=true"]))


def test_show_output_loads_back_to_the_same_config(tmp_path):
    job = load_job(None, ["actor.optim.lr=3e-6", "rollout.fast.max_num_seqs=4", "data.train_files=['a','b']"],
                   manager=manager(), check=False)
    text = to_toml(job.config)
    tomllib.loads(text)  # valid TOML
    again = load_job(write(tmp_path, text), [], manager=manager(), check=False)
    assert again.config == job.config


def test_missing_and_invalid_files_are_config_errors(tmp_path):
    assert "does not exist" in problems_of(tmp_path / "nope.toml")[0]
    assert "is not valid TOML" in problems_of(write(tmp_path, "[actor\n"))[0]


def test_validate_cli_prints_every_problem_without_traceback(tmp_path):
    path = write(tmp_path, "[actor]\nclip_ratoi = 0.3\nppo_epochs = 1.5\n[actor.optim]\nlr = -1.0\n")
    result = run_rlcore("config", "validate", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for expected in ('actor.clip_ratoi: unknown key (did you mean "clip_ratio"?)',
                     "actor.ppo_epochs: expected an integer, got a float 1.5",
                     "actor.optim.lr: must be > 0.0, got -1.0"):
        assert expected in result.stderr
    assert str(path) in result.stderr


def test_debug_flag_shows_the_traceback(tmp_path):
    result = run_rlcore("--debug", "config", "validate", str(tmp_path / "missing.toml"))
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_validation_settings_need_validation_data():
    problems = problems_of(None, ["trainer.val_only=true"])
    assert "trainer.val_only validates and stops, but there is no validation data: set data.val_files" in problems
    job = load_job(None, ["trainer.log_val_generations=3", "trainer.validation_data_dir='v'"], manager=manager())
    assert "trainer.log_val_generations has no effect without validation data (data.val_files)" in job.warnings
    assert "trainer.validation_data_dir has no effect without validation data (data.val_files)" in job.warnings
    assert not load_job(None, ["trainer.val_only=true", "trainer.log_val_generations=3", "data.val_files='t.parquet'"],
                        manager=manager()).warnings


# Every setting that has no effect given the others, by the registered job check that warns of it:
# (check name, overrides, the warning's start). A check with an ``unused`` part and no row here fails
# test_every_unused_check_has_a_row.
BASE = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4"]
WITHOUT_EFFECT = [
    ("advantage_estimator", ["algorithm.adv_estimator=grpo", "rollout.n=1"],
     "algorithm.adv_estimator = 'grpo' compares samples within a group, but rollout.n = 1"),
    ("advantage_estimator", ["algorithm.adv_estimator=grpo", "rollout.n=2", "algorithm.gdpo_reward_keys=['acc']"],
     "algorithm.gdpo_reward_keys has no effect: algorithm.adv_estimator = 'grpo' reads the summed score"),
    ("advantage_estimator", ["algorithm.adv_estimator=grpo", "rollout.n=2", "critic.optim.lr=1e-4"],
     "critic.optim.lr has no effect: algorithm.adv_estimator = 'grpo' runs without a critic"),
    ("kl", ["actor.kl_loss_type=k1"], "actor.kl_loss_type has no effect while actor.use_kl_loss is false"),
    ("kl", ["algorithm.kl_penalty=k1"], "algorithm.kl_penalty has no effect while algorithm.use_kl_in_reward is false"),
    ("rollout_correction", ["algorithm.rollout_is_level=sequence"],
     "algorithm.rollout_is_level has no effect while algorithm.rollout_is_threshold is unset"),
    ("rollout_correction", ["algorithm.rollout_bypass_loss=reinforce"],
     "algorithm.rollout_bypass_loss has no effect while algorithm.rollout_bypass is false"),
    ("reward", ["reward.custom_reward_function.batch=true"],
     "reward.custom_reward_function.batch has no effect without reward.custom_reward_function.path"),
    ("reward", ["reward.custom_reward_function.name=score"],
     "reward.custom_reward_function.name has no effect without reward.custom_reward_function.path"),
    ("lr_schedule", ["actor.optim.min_lr_ratio=0.1"],
     "actor.optim.min_lr_ratio has no effect while actor.optim.lr_scheduler is 'constant'"),
    ("distillation", ["distillation.coef=0.5"], "distillation.coef has no effect while distillation.enable is false"),
    ("checkpoint", ["trainer.resume_from_path=/x"],
     "trainer.resume_from_path has no effect unless trainer.resume_mode = 'resume_path'"),
    ("validation", ["trainer.log_val_generations=4"],
     "trainer.log_val_generations has no effect without validation data (data.val_files)"),
    ("profiler", ["profiler.with_stack=true"], "profiler.with_stack has no effect without profiler.steps"),
]


@pytest.mark.parametrize(("check", "overrides", "warning"), WITHOUT_EFFECT,
                         ids=[f"{row[0]}:{row[1][-1].split('=')[0]}" for row in WITHOUT_EFFECT])
def test_a_setting_without_effect_is_warned_about_by_name(check, overrides, warning):
    job = load_job(None, BASE + overrides, manager=manager())
    assert any(w.startswith(warning) for w in job.warnings), job.warnings
    without = load_job(None, BASE + [o for o in overrides if not o.startswith(warning.split()[0] + "=")],
                       manager=manager())
    assert not any(w.startswith(warning) for w in without.warnings), without.warnings


def test_every_unused_check_has_a_row():
    from rlcore.config.checks import registered_checks

    warning_checks = {name for name, check in registered_checks(manager(), machine=True) if check.unused}
    assert warning_checks == {row[0] for row in WITHOUT_EFFECT}
