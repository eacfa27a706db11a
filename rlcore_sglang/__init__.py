"""rlcore plugin: the ``sglang`` rollout engine.

Registers nothing yet: the engine arrives with its own issue, and rlcore never registers a name
whose implementation is a stub.
"""
