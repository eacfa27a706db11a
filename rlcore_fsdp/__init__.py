"""rlcore plugin: the ``fsdp`` training backend (FSDP2, ``torch.distributed.fsdp.fully_shard``) and
its ``[actor.fsdp]``, ``[ref.fsdp]`` and ``[critic.fsdp]`` tables, and the ``rlcore export`` command that
turns its checkpoints into Hugging Face folders.

Registered through the ``rlcore`` entry-point group like any third-party plugin. Importing this
module imports no model code; the roles are built when the worker asks ``FsdpBackend`` for them.
"""

from rlcore.api import hookimpl
from rlcore_fsdp.options import SECTIONS, FsdpOptions


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_fsdp.backend import FsdpBackend

    register("fsdp", FsdpBackend(), default=True)  # the backend of a job that names none


@hookimpl
def rlcore_register_config_sections(register):
    for section in SECTIONS:
        register(section, FsdpOptions)


@hookimpl
def rlcore_register_verl_keys(register):
    from rlcore_fsdp.verl import VERL_KEYS

    register("fsdp", VERL_KEYS)


@hookimpl
def rlcore_register_cli_commands(register):
    from rlcore_fsdp.export import COMMAND

    register("export", COMMAND)
