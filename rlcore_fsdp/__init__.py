"""rlcore plugin: the ``fsdp`` training backend (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Registered through the ``rlcore`` entry-point group like any third-party plugin. Importing this
module imports no model code; the roles are built when the worker asks ``FsdpBackend`` for them.
"""

from rlcore import hookimpl


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_fsdp.backend import FsdpBackend

    register("fsdp", FsdpBackend())
