"""rlcore plugin: the ``ascend`` hardware platform (Huawei Ascend NPUs through torch_npu).

Loading the plugin never imports torch_npu; detection does, and only where it is installed.
"""

from rlcore.api import hookimpl


@hookimpl
def rlcore_register_platforms(register):
    from rlcore_ascend.platform import AscendPlatform

    register("ascend", AscendPlatform)
