"""What a rollout engine declares about itself: attributes of its registered factory set to ``True``
(``colocated_faster_on_one_device``, ``returns_routed_experts``, ...), as a backend declares
capabilities on its ``TrainingBackend``; engines have no contract class, so an attribute left unset is
``False``."""

from __future__ import annotations


def engine_declares(manager, name: str | None, attribute: str) -> bool:
    """Whether the engine registered as ``name`` sets ``attribute`` to True (False for an unknown name)."""
    registry = manager.registry("rollout_engines")
    return name in registry and getattr(registry.get(name), attribute, False) is True


def engines_declaring(manager, attribute: str) -> list[str]:
    """The registered engines that set ``attribute`` to True."""
    return [name for name in manager.registry("rollout_engines").names() if engine_declares(manager, name, attribute)]
