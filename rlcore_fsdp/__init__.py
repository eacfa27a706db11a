"""rlcore plugin: the ``fsdp`` training backend (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Registers nothing yet: the backend arrives with its own issue, and rlcore never registers a name
whose implementation is a stub.
"""
