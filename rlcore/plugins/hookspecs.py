"""The hooks a plugin implements. Each receives ``register(name, value)`` and calls it once per thing.

A plugin module (or object) marks its implementations with ``hookimpl``, imported, like every core
name a plugin uses, from ``rlcore.api``::

    from rlcore.api import hookimpl

    @hookimpl
    def rlcore_register_reward_functions(register):
        register("my/dataset", compute_score)

An implementation may take no arguments at all; pluggy allows a subset of the spec's arguments.
``register(name, value, default=True)`` declares the default of its kind, for a job that names none
(``trainer.backend``, ``rollout.name``); two plugins declaring one are an error when a job needs it.
"""

import pluggy

hookspec = pluggy.HookspecMarker("rlcore")
hookimpl = pluggy.HookimplMarker("rlcore")


@hookspec
def rlcore_register_training_backends(register):
    """Register training backends by name (``trainer.backend``): an instance of a
    ``rlcore.api.TrainingBackend`` subclass, building the roles and declaring its capabilities."""


@hookspec
def rlcore_register_rollout_engines(register):
    """Register rollout engines by name (``rollout.name``): a factory ``(config, platform, actor)``."""


@hookspec
def rlcore_register_platforms(register):
    """Register hardware platforms by name: a ``rlcore.runtime.platforms.Platform`` subclass."""


@hookspec
def rlcore_register_advantage_estimators(register):
    """Register advantage estimators by name (``algorithm.adv_estimator``)."""


@hookspec
def rlcore_register_policy_losses(register):
    """Register policy losses by name (``actor.policy_loss``)."""


@hookspec
def rlcore_register_kl_estimators(register):
    """Register KL estimators by name (``actor.kl_loss_type``, ``algorithm.kl_penalty``)."""


@hookspec
def rlcore_register_reward_functions(register):
    """Register reward functions keyed by a sample's ``data_source``."""


@hookspec
def rlcore_register_rewards(register):
    """Register rewards by name (``reward.kind``): a factory ``(config, tokenizer, manager, dispatch)``
    returning an ``rlcore.api.Reward``; ``dispatch(method, batch)`` runs a hybrid worker method on the
    workers' shares (the reward model's ``compute_rm_score``)."""


@hookspec
def rlcore_register_loggers(register):
    """Register metric loggers by name (``trainer.logger``)."""


@hookspec
def rlcore_register_data_preprocessors(register):
    """Register dataset preprocessors by name (``rlcore data NAME``)."""


@hookspec
def rlcore_register_config_sections(register):
    """Register an attrs class validating a plugin-owned TOML table, keyed by its dotted path."""


@hookspec
def rlcore_register_verl_keys(register):
    """Register what becomes of verl's keys for this plugin's own tables (mapped onto its settings,
    values translated, ignored or refused): an ``rlcore.api.VerlKeys`` (any name, the plugin's own)."""


@hookspec
def rlcore_register_job_checks(register):
    """Register checks of whole jobs by name: an ``rlcore.api.JobCheck`` whose ``problems(job)`` and
    ``unused(job)`` report errors and settings without effect for the component's own settings (and
    what they need of the rest of the job); ``rlcore config validate`` and ``rlcore train`` report
    every check's findings together."""


@hookspec
def rlcore_register_cli_commands(register):
    """Register ``rlcore`` subcommands: a ``rlcore.cli.Command``."""


@hookspec
def rlcore_register_tools(register):
    """Register tools a model may call in multi-turn rollouts: an ``rlcore.tools.Tool``."""


@hookspec
def rlcore_register_agents(register):
    """Register agent programs by name (``rollout.agent.name``): an ``rlcore.api.Agent``, whose async
    ``run(episode, client)`` drives one episode through the job's OpenAI-compatible endpoint."""


# hook name -> the kind of thing it registers, as shown to users.
KINDS = {
    "rlcore_register_training_backends": "training_backends",
    "rlcore_register_rollout_engines": "rollout_engines",
    "rlcore_register_platforms": "platforms",
    "rlcore_register_advantage_estimators": "advantage_estimators",
    "rlcore_register_policy_losses": "policy_losses",
    "rlcore_register_kl_estimators": "kl_estimators",
    "rlcore_register_reward_functions": "reward_functions",
    "rlcore_register_rewards": "rewards",
    "rlcore_register_loggers": "loggers",
    "rlcore_register_data_preprocessors": "data_preprocessors",
    "rlcore_register_config_sections": "config_sections",
    "rlcore_register_verl_keys": "verl_keys",
    "rlcore_register_job_checks": "job_checks",
    "rlcore_register_cli_commands": "cli_commands",
    "rlcore_register_tools": "tools",
    "rlcore_register_agents": "agents",
}
