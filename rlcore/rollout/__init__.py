"""Rollout engines built into the core: ``hf`` (transformers ``generate`` on the actor's own module)."""
