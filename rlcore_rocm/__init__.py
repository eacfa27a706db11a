"""rlcore plugin: the ``rocm`` hardware platform (AMD GPUs through a ROCm build of torch)."""

from rlcore.api import hookimpl


@hookimpl
def rlcore_register_platforms(register):
    from rlcore_rocm.platform import RocmPlatform

    register("rocm", RocmPlatform)
