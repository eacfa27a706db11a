"""rlcore plugin: the ``rocm`` hardware platform (AMD GPUs).

Registers nothing yet: the platform arrives with its own issue, and rlcore never registers a name
whose implementation is a stub.
"""
