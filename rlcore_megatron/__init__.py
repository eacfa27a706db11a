"""rlcore plugin: the ``megatron`` training backend (megatron-core).

Registers nothing yet: the backend arrives with its own issue, and rlcore never registers a name
whose implementation is a stub.
"""
