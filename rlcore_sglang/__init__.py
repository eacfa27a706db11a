"""rlcore plugin: the ``sglang`` rollout engine (``rollout.name = "sglang"``) and its ``[rollout.sglang]`` table.

Imports without SGLang: the engine module, and SGLang with it, load only when a job picks the engine.
Built against SGLang 0.5.12-0.5.17 (checked against their sources); not yet run against a real SGLang.
"""

from rlcore.api import RolloutEngine, VerlKeys, hookimpl
from rlcore_sglang.options import SglangOptions


def sglang_rollout(spec, platform, actor):
    """The registered factory: builds a ``SglangRollout`` (importing SGLang now)."""
    from rlcore_sglang.rollout import SglangRollout

    return SglangRollout(spec, platform, actor)


@hookimpl
def rlcore_register_rollout_engines(register):
    # requires: checked before a job starts (rlcore.runs.preflight) and by `rlcore plugins`
    register("sglang", RolloutEngine(sglang_rollout, requires=("sglang",)))


@hookimpl
def rlcore_register_config_sections(register):
    register("rollout.sglang", SglangOptions)


@hookimpl
def rlcore_register_verl_keys(register):
    register("sglang", VerlKeys(aliases=(
        ("actor_rollout_ref.rollout.engine_kwargs.sglang", "rollout.sglang.engine_kwargs"),
        ("actor_rollout_ref.rollout.engine_kwargs.sglang.", "rollout.sglang.engine_kwargs."),
    )))
