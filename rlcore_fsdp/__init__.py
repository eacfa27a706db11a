"""rlcore plugin: the ``fsdp`` training backend (FSDP2, ``torch.distributed.fsdp.fully_shard``) and
the ``rlcore export`` command that turns its checkpoints into Hugging Face folders.

Registered through the ``rlcore`` entry-point group like any third-party plugin. Importing this
module imports no model code; the roles are built when the worker asks ``FsdpBackend`` for them.
"""

from rlcore.api import hookimpl


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_fsdp.backend import FsdpBackend

    register("fsdp", FsdpBackend())


@hookimpl
def rlcore_register_cli_commands(register):
    from rlcore_fsdp.export import COMMAND

    register("export", COMMAND)
