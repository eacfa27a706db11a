"""Reading a verl launch script's overrides (``rlcore.config.verl_script``) as the shell would expand them."""

from rlcore.config.verl_script import overrides_of_script

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
