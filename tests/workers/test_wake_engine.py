"""The hybrid worker wakes a sleeping engine after handing torch's cached memory back to the device
(``rlcore.workers.hybrid.wake_engine``); on the GPU, ``tests/vllm/test_on_gpu.py`` wakes a vllm engine
beside a cache that would otherwise leave it too little memory."""

from __future__ import annotations

from rlcore.workers.hybrid import wake_engine


class Calls(list):
    """The platform's and the engine's calls, in order."""

    def empty_cache(self):
        self.append("empty the trainer's cache")

    def resume_memory(self):
        self.append("engine wakes")


def test_the_cache_goes_back_before_a_sleeping_engine_wakes():
    calls = Calls()
    wake_engine(calls, calls, engine_sleeps=True)
    assert calls == ["empty the trainer's cache", "engine wakes"]


def test_an_engine_that_never_sleeps_leaves_the_trainers_cache_alone():
    # rollout.free_cache_engine = false (the colocated GSM8K example): emptying the cache would only make
    # the trainer's next pass allocate its memory again
    calls = Calls()
    wake_engine(calls, calls, engine_sleeps=False)
    assert calls == ["engine wakes"]
