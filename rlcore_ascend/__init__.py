"""rlcore plugin: the ``ascend`` hardware platform (Huawei Ascend NPUs via torch_npu).

Registers nothing yet: the platform arrives with its own issue, and rlcore never registers a name
whose implementation is a stub.
"""
