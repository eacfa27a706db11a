"""rlcore plugin: the ``vllm`` rollout engine (``rollout.name = "vllm"``) and its ``[rollout.vllm]`` table.

Imports without vLLM: the engine module, and vLLM with it, load only when a job picks the engine.
"""

from rlcore.api import hookimpl
from rlcore_vllm.options import VllmOptions


def vllm_rollout(config, platform, actor):
    """The registered factory: builds a ``VllmRollout`` (importing vLLM now)."""
    from rlcore_vllm.rollout import VllmRollout

    return VllmRollout(config, platform, actor)


vllm_rollout.requires = ("vllm",)  # checked before a job starts (rlcore.preflight) and by `rlcore plugins`


@hookimpl
def rlcore_register_rollout_engines(register):
    register("vllm", vllm_rollout)


@hookimpl
def rlcore_register_config_sections(register):
    register("rollout.vllm", VllmOptions)
