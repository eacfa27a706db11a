"""Reading a verl launch script's overrides (``rlcore.config.verl_script``) as the shell would expand them."""

import pytest

from rlcore.config import load_job
from rlcore.config.from_verl import from_verl
from rlcore.config.overrides import verl_mapping
from rlcore.config.verl_script import overrides_of_script, read_script
from rlcore.errors import PluginError
from rlcore.plugins.manager import PluginManager
from tests.core.test_overrides import TurboOptions, TurboPlugin

SCRIPT = '''#!/usr/bin/env bash
lr=1e-6
mini=32
ACTOR_CONFIG="
    actor_rollout_ref.actor.optim.lr=$lr \\
    actor_rollout_ref.actor.ppo_mini_batch_size=$mini"
ROLLOUT_CONFIG="actor_rollout_ref.rollout.n=8"
ACTOR_CONFIG="$ACTOR_CONFIG $ROLLOUT_CONFIG"
EXTRA=(
    model_engine=veomni
    $ACTOR_CONFIG
)
python -m verl.trainer.main_ppo \\
    data.train_batch_size=128 \\
    trainer.experiment_name="a b" \\
    "${EXTRA[@]}" \\
    $ROLLOUT_CONFIG \\
    "$@"
'''


def test_a_quoted_variable_over_several_lines_used_unquoted_gives_each_override():
    assert overrides_of_script(SCRIPT) == [
        "data.train_batch_size=128", "trainer.experiment_name=a b", "model_engine=veomni",
        "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.n=8"]


def test_a_value_with_spaces_that_is_not_a_list_of_overrides_stays_one_word():
    script = 'NAME="my run"\npython3 -m verl.trainer.main_ppo trainer.experiment_name=$NAME\n'
    assert overrides_of_script(script) == ["trainer.experiment_name=my run"]


def test_only_the_matching_arm_of_a_case_block_sets_variables():
    """verl's DPPO script sets its clip range per loss in a case block; an arm that does not match
    must not set anything; a device the script probes at run time takes the first arm (gpu)."""
    script = '''LOSS_MODE=${LOSS_MODE:-dppo_kl}
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
case $LOSS_MODE in
    dppo_tv)  CLIP_DEFAULT=0.15 ;;
    dppo_kl|kl)  CLIP_DEFAULT=0.05 ;;
    *) echo "Unknown LOSS_MODE: $LOSS_MODE"; exit 1 ;;
esac
workers=8
case "${DEVICE}" in
    gpu)
        workers=4
        ;;
    npu)
        workers=16
        ;;
esac
python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.clip_ratio_low=${CLIP_LOW:-$CLIP_DEFAULT} trainer.n_gpus_per_node=$workers
'''
    assert overrides_of_script(script) == ["actor_rollout_ref.actor.clip_ratio_low=0.05", "trainer.n_gpus_per_node=4"]


def test_a_positional_parameter_with_a_default_takes_the_default():
    """verl's run_qwen3_30b_veomni.sh picks its engine with ENGINE=${1:-vllm}; read as run without arguments."""
    script = 'ENGINE=${1:-vllm}\npython3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=${ENGINE}\n'
    assert overrides_of_script(script) == ["actor_rollout_ref.rollout.name=vllm"]


IF_SCRIPT = '''DEVICE=${DEVICE:-gpu}
INFER_BACKEND=vllm
EXTRA=()
if [ "${VERL_USE_UV:-1}" != 0 ] && [ "${DEVICE:-gpu}" = gpu ] && { [ "${INFER_BACKEND}" = vllm ] || [ "${INFER_BACKEND}" = sglang ]; }; then
    EXTRA+=(actor_rollout_ref.rollout.name=${INFER_BACKEND})
fi
if [ "${DEVICE}" = npu ]; then
    EXTRA+=(actor_rollout_ref.rollout.data_parallel_size=${ROLLOUT_DP:-8})
elif [ -n "${ROLLOUT_DP}" ]; then
    EXTRA+=(actor_rollout_ref.rollout.data_parallel_size=${ROLLOUT_DP})
else
    EXTRA+=(trainer.nnodes=1)
fi
if [ -n "$MCORE_MODEL_PATH" ]
then
    EXTRA+=(actor_rollout_ref.actor.megatron.use_dist_checkpointing=True)
    if [ "${SP_SIZE:-1}" -gt 1 ]; then
        EXTRA+=(actor_rollout_ref.actor.megatron.context_parallel_size=${SP_SIZE})
    fi
fi
python3 -m verl.trainer.main_ppo data.train_batch_size=8 "${EXTRA[@]}"
'''


def test_an_if_block_runs_the_branch_whose_test_holds_unset_variables_being_empty():
    """As the script runs in a shell without those variables: the string tests joined by && / || /
    { ...; } decide; ROLLOUT_DP and MCORE_MODEL_PATH are unset, so their branches (nested ones too)
    add nothing, and the else branch does."""
    assert overrides_of_script(IF_SCRIPT) == [
        "data.train_batch_size=8", "actor_rollout_ref.rollout.name=vllm", "trainer.nnodes=1"]


def test_a_variable_the_script_sets_picks_its_branch():
    script = IF_SCRIPT.replace("DEVICE=${DEVICE:-gpu}", "DEVICE=npu")
    assert overrides_of_script(script) == [
        "data.train_batch_size=8", "actor_rollout_ref.rollout.data_parallel_size=8"]
    script = IF_SCRIPT.replace("EXTRA=()", "EXTRA=()\nMCORE_MODEL_PATH=/ckpt\nSP_SIZE=2")
    assert overrides_of_script(script)[-2:] == [
        "actor_rollout_ref.actor.megatron.use_dist_checkpointing=True",
        "actor_rollout_ref.actor.megatron.context_parallel_size=2"]


def test_a_test_that_cannot_be_decided_here_lets_every_branch_count():
    """The number of arguments, a file test or a command's output are known only when the script runs."""
    for test in ('[ "$#" -lt 2 ]', "[ -f /etc/hosts ]", '[ "$(hostname)" = head ]'):
        script = f'''X=()
if {test}; then
    X+=(a.b=1)
else
    X+=(c.d=2)
fi
python -m verl.trainer.main_ppo "${{X[@]}}"
'''
        assert overrides_of_script(script) == ["a.b=1", "c.d=2"], test



TURBO = {"turbo_trainer": {"trainer.backend": "turbo", "actor.turbo.depth": "3"}}


def turbo_mapping():
    return verl_mapping(PluginManager(autoload=False, plugins={"turbo": TurboPlugin(config_names=TURBO)}))


@pytest.mark.parametrize("option", ["--config-name='turbo_trainer.yaml'", "--config-name turbo_trainer",
                                    "-cn turbo_trainer", '--config-name="$NAME"'])
def test_a_config_name_a_plugin_declares_gives_its_settings_ahead_of_the_scripts_overrides(option):
    script = read_script(f"NAME=turbo_trainer.yaml\npython3 -m verl.trainer.main_ppo --config-path=config {option} "
                         "data.train_batch_size=8 2>&1 | tee log\n", mapping=turbo_mapping())
    assert script.config_name == "turbo_trainer"
    assert script.overrides == ["trainer.backend=turbo", "actor.turbo.depth=3", "data.train_batch_size=8"]
    assert script.notes == ["--config-name=turbo_trainer gives trainer.backend=turbo, actor.turbo.depth=3, ahead of "
                            "the script's overrides"]
    assert script.ignored == []


def test_the_scripts_own_overrides_win_over_what_its_config_name_implies():
    manager = PluginManager(autoload=False, plugins={"turbo": TurboPlugin(config_names=TURBO)})
    script = read_script("python3 -m verl.trainer.main_ppo --config-name=turbo_trainer trainer.backend=other "
                         "actor.turbo.depth=5\n", mapping=verl_mapping(manager))
    job = load_job(None, script.overrides, manager=manager, check=False)
    assert job.config.trainer.backend == "other"
    assert job.config.section("actor.turbo") == TurboOptions(depth=5)
    implied = load_job(None, read_script("python3 -m verl.trainer.main_ppo -cn turbo_trainer\n",
                                         mapping=verl_mapping(manager)).overrides, manager=manager, check=False)
    assert implied.config.trainer.backend == "turbo" and implied.config.section("actor.turbo") == TurboOptions(depth=3)


def test_verls_default_config_name_implies_rlcores_defaults_and_an_undeclared_one_is_ignored_saying_why():
    mapping = turbo_mapping()
    default = read_script("python3 -m verl.trainer.main_ppo --config-name=ppo_trainer a.b=1\n", mapping=mapping)
    assert (default.overrides, default.ignored) == (["a.b=1"], [])
    assert default.notes == ["--config-name=ppo_trainer is verl's default trainer config: rlcore's defaults"]
    unknown = read_script("python3 -m verl.trainer.main_ppo --config-name='fully_async_ppo_trainer.yaml' a.b=1\n",
                          mapping=mapping)
    assert (unknown.overrides, unknown.notes) == (["a.b=1"], [])
    assert unknown.ignored == [
        "--config-name=fully_async_ppo_trainer is ignored: no installed plugin declares what verl's "
        "'fully_async_ppo_trainer' trainer config sets (known: ppo_trainer, turbo_trainer); the job starts from "
        "rlcore's defaults, not from that config's"]
    # without the plugin, its config name is one nobody declares
    alone = read_script("python3 -m verl.trainer.main_ppo --config-name=turbo_trainer\n",
                        mapping=verl_mapping(PluginManager(autoload=False)))
    assert alone.overrides == [] and alone.ignored[0].startswith("--config-name=turbo_trainer is ignored")
    plain = read_script("python3 -m verl.trainer.main_ppo a.b=1\n", mapping=mapping)
    assert (plain.overrides, plain.config_name, plain.notes, plain.ignored) == (["a.b=1"], None, [], [])


def test_a_config_name_declared_twice_names_both_claimants():
    plugin = TurboPlugin(config_names={"ppo_trainer": {"trainer.backend": "turbo"}})
    with pytest.raises(PluginError, match=r"verl config name 'ppo_trainer' is mapped twice: by the core and by "
                                          r"plugin 'turbo'"):
        verl_mapping(PluginManager(autoload=False, plugins={"turbo": plugin}))


def test_from_verl_reports_an_undeclared_config_name_as_ignored(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo --config-name=evaluation data.train_batch_size=8\n")
    job = tmp_path / "job.toml"
    assert from_verl(str(script), str(job)) == 0
    report = capsys.readouterr().err
    assert "ignored: --config-name=evaluation is ignored: no installed plugin declares what verl's 'evaluation'" \
        in report
    assert "1 ignored" in report and "train_batch_size = 8" in job.read_text()
