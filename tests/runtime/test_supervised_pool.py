"""The supervised pool that runs reward functions and tool calls: per-call limits, dead workers
replaced, failures named; the reward- and tool-specific behaviour is tested in tests/rewards, tests/tools."""

from __future__ import annotations

import os
import time

from rlcore.runtime.supervised_pool import Call, SupervisedPool


def nap(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def crash(code: int) -> None:
    os._exit(code)


def unpicklable():
    return lambda: None


def test_each_call_has_its_own_time_limit():
    with SupervisedPool(2, timeout_s=30.0, timeout_setting="x.timeout_s") as pool:
        start = time.monotonic()
        outcomes = pool.run([Call(nap, (5.0,), timeout_s=0.5), Call(nap, (0.0,)), Call(nap, (2.0,), timeout_s=0.3)])
        assert time.monotonic() - start < 4  # the 5 s nap was cut at its own 0.5 s, not the pool's 30 s
    assert outcomes[0].timed_out and outcomes[0].value == "did not return within 0.5 s"
    assert outcomes[1].ok and outcomes[1].value != os.getpid()  # it ran in a worker process
    assert outcomes[2].timed_out and 0.3 <= outcomes[2].seconds < 2
    assert pool.replaced == 2


def test_the_pool_limit_names_its_setting_and_a_dead_worker_is_replaced():
    with SupervisedPool(1, timeout_s=0.5, timeout_setting="x.timeout_s") as pool:
        outcomes = pool.run([Call(nap, (10.0,)), Call(crash, (3,)), Call(unpicklable), Call(nap, (0.0,))])
        assert outcomes[0].value == "did not return within x.timeout_s = 0.5 s"
        assert not outcomes[1].ok and outcomes[1].value == "killed its worker process (exit code 3)"
        assert not outcomes[2].ok and "cannot be sent back" in outcomes[2].value
        assert outcomes[3].ok  # a fresh worker took each dead one's place
        assert pool.replaced == 2


def test_a_call_s_time_starts_once_its_worker_holds_it(tmp_path, monkeypatch):
    # a module that takes a second to import: the worker imports it when it unpickles the call
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(1.0)\n\ndef quick():\n    return 'done'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import

    with SupervisedPool(1, timeout_s=0.5) as pool:  # spawned with this sys.path
        outcome = pool.run([Call(slow_to_import.quick)])[0]
    assert outcome.ok and outcome.value == "done" and outcome.seconds < 0.5
