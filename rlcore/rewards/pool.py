"""Reward functions in the supervised pool of worker processes (``rlcore.runtime.supervised_pool``).

Each call runs in one of ``reward.num_workers`` worker processes, with at most ``reward.timeout_s``
seconds per call and ``reward.batch_timeout_s`` for the whole batch; a worker that timed out or died
is replaced and its sample's ``Outcome`` says what happened, for the scorer's ``reward.on_error``.
A function travels by reference: a registered one as itself (pickled by its import path), a user
file's as ``FileFunction`` (path and name, loaded once per worker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from rlcore.rewards.custom import load_reward_function
from rlcore.runtime.supervised_pool import Call, Outcome, SupervisedPool

__all__ = ["FileFunction", "Outcome", "RewardPool"]

_LOADED: dict = {}  # FileFunction -> the function, per process


@attrs.frozen
class FileFunction:
    """A function defined in a user's file (``reward.custom_reward_function``): loaded in the worker."""

    path: str
    name: str

    def __call__(self, *args, **kwargs):
        if self not in _LOADED:
            _LOADED[self] = load_reward_function(self.path, self.name)
        return _LOADED[self](*args, **kwargs)


class RewardPool(SupervisedPool):
    """The reward workers; failures are phrased with the ``reward.*`` settings that bound them."""

    def __init__(self, workers: int, timeout_s: float, batch_timeout_s: float | None = None):
        super().__init__(workers, timeout_s, batch_timeout_s, name="rlcore-reward",
                         timeout_setting="reward.timeout_s", batch_timeout_setting="reward.batch_timeout_s")

    def run(self, calls: list[tuple[Any, dict]], on_failure: Callable[[int, Outcome], None] | None = None
            ) -> list[Outcome]:
        """One ``Outcome`` per ``(function reference, keyword arguments)`` call, in order;
        ``on_failure(index, outcome)`` hears of each failure at once."""
        return super().run([Call(function, kwargs=kwargs) for function, kwargs in calls], on_failure)
