"""rlcore plugin: the ``megatron`` training backend (megatron-core) and its ``[actor.megatron]``,
``[ref.megatron]`` and ``[critic.megatron]`` tables.

Imports without megatron-core: the roles, and megatron-core with them, load only when a job picks
the backend (``trainer.backend = "megatron"``, verl's ``model_engine=megatron``). The backend is
unverified until a GPU session runs ``tests/megatron`` there (see ``rlcore_megatron.backend``).
"""

from rlcore.api import hookimpl
from rlcore_megatron.options import SECTIONS, MegatronOptions


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_megatron.backend import MegatronBackend

    register("megatron", MegatronBackend())


@hookimpl
def rlcore_register_config_sections(register):
    for section in SECTIONS:
        register(section, MegatronOptions)


@hookimpl
def rlcore_register_verl_keys(register):
    from rlcore_megatron.verl import VERL_KEYS

    register("megatron", VERL_KEYS)
