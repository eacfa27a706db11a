"""Reward functions that misbehave, run in the supervised pool: a hang, an exit, a killed process.
Each costs its sample (named, counted, or the job stops as reward.on_error says), never the driver."""

from __future__ import annotations

import logging
import os
import time

import pytest

from rlcore.errors import RlcoreError
from rlcore.plugins.registry import Registry
from rlcore.rewards.config import CustomRewardFunction, RewardConfig
from rlcore.rewards.pool import FileFunction, RewardPool
from rlcore.rewards.scorer import RewardScorer

MISBEHAVING = '''
import os, signal, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "exit":
        sys.exit(0)
    if solution_str == "die":
        os._exit(7)
    if solution_str == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if solution_str == "slow":
        time.sleep(0.3)
    return float(solution_str == ground_truth)
'''


@pytest.fixture
def misbehaving(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(MISBEHAVING)
    return path


def scorer(path, **settings) -> RewardScorer:
    config = RewardConfig(custom_reward_function=CustomRewardFunction(path=str(path)), **settings)
    return RewardScorer(config, Registry("reward_functions"))


def score(s: RewardScorer, responses: list[str]):
    size = len(responses)
    return s.score(["src"] * size, responses, ["1"] * size, [None] * size)


def test_a_hanging_reward_times_out_and_the_next_samples_are_scored(misbehaving):
    s = scorer(misbehaving, on_error="zero", timeout_s=1.0, num_workers=2)
    try:
        start = time.monotonic()
        result = score(s, ["1", "hang", "0", "1", "hang", "1"])
        assert time.monotonic() - start < 10
        assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
        assert result.metrics["reward/errors"] == 2 and result.metrics["reward/timeouts"] == 2
        assert result.metrics["timing_s/reward_slowest_sample"] >= 1.0
        assert score(s, ["1", "0"]).scores.tolist() == [1.0, 0.0]  # the replaced workers serve on
    finally:
        s.close()


def test_a_hang_stops_the_job_naming_the_function_and_sample_by_default(misbehaving):
    s = scorer(misbehaving, timeout_s=1.0, num_workers=1)
    try:
        with pytest.raises(RlcoreError, match=r"reward\.py:compute_score did not return within "
                                              r"reward\.timeout_s = 1 s on sample 1 \(data_source 'src'"):
            score(s, ["1", "hang"])
    finally:
        s.close()


@pytest.mark.parametrize("response, problem", [
    ("exit", r"called sys\.exit\(0\) at .*reward\.py:\d+"),
    ("die", r"killed its worker process \(exit code 7\)"),
    ("signal", r"killed its worker process \(exit code -9\)"),
])
def test_an_exit_or_a_killed_worker_is_named_and_the_worker_replaced(misbehaving, response, problem):
    s = scorer(misbehaving, timeout_s=30.0, num_workers=1)
    try:
        with pytest.raises(RlcoreError, match=rf"compute_score {problem} on sample 0"):
            score(s, [response])
        assert score(s, ["1"]).scores.tolist() == [1.0]  # a fresh worker took its place
    finally:
        s.close()


def test_the_batch_timeout_bounds_the_whole_batch(misbehaving):
    function = FileFunction(str(misbehaving), "compute_score")
    with RewardPool(1, timeout_s=30.0, batch_timeout_s=1.0) as pool:
        assert pool.run([(function, dict(data_source="s", solution_str="1", ground_truth="1"))])[0].value == 1.0
        start = time.monotonic()
        outcomes = pool.run([(function, dict(data_source="s", solution_str="slow", ground_truth="1"))] * 6)
        assert time.monotonic() - start < 3
    scored = [o.ok for o in outcomes]
    assert scored[0] and not scored[-1] and scored == sorted(scored, reverse=True)  # a prefix ran, then time ran out
    assert all(o.timed_out and "reward.batch_timeout_s = 1 s" in o.value for o in outcomes if not o.ok)


def test_the_calls_run_in_the_worker_processes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    return {'score': 1.0, 'pid': float(os.getpid())}\n")
    s = scorer(probe, num_workers=2)
    try:
        pids = score(s, ["a", "b", "c", "d"]).extra["pid"]
        assert os.getpid() not in pids and 1 <= len(set(pids)) <= 2
    finally:
        s.close()


def test_no_workers_scores_in_the_driver(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                     "    return {'score': 1.0, 'pid': float(os.getpid())}\n")
    s = scorer(probe, num_workers=0)
    assert score(s, ["a", "b"]).extra["pid"] == [float(os.getpid())] * 2


class _TimedRecords(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.getMessage()))


def test_a_timeout_is_reported_at_once_while_the_rest_of_the_batch_runs(misbehaving):
    """A hung call is named (function, sample, seconds) when its limit passes, not after the batch:
    here the batch's other calls are still running (slow) when the report comes."""
    s = scorer(misbehaving, on_error="zero", timeout_s=1.0, num_workers=2)
    handler, scorer_log = _TimedRecords(), logging.getLogger("rlcore.rewards.scorer")
    scorer_log.addHandler(handler)
    try:
        start = time.monotonic()
        result = score(s, ["hang"] + ["slow"] * 12)  # one worker hangs; the other scores 12 x 0.3 s
        finished = time.monotonic()
    finally:
        scorer_log.removeHandler(handler)
        s.close()
    reported = handler.records
    assert result.metrics["reward/timeouts"] == 1
    when, message = next((t, m) for t, m in reported if "did not return" in m)
    assert "reward.py:compute_score did not return within reward.timeout_s = 1 s on sample 0 after 1." in message
    assert "the sample scores 0" in message
    assert when - start < finished - start - 1.0, "the timeout was reported only when the batch ended"


def test_more_failures_than_the_budget_stop_the_job_naming_the_function(misbehaving):
    s = scorer(misbehaving, on_error="zero", timeout_s=1.0, num_workers=2, max_failed_share=0.25)
    try:
        assert score(s, ["1", "exit", "1", "1"]).metrics["reward/errors"] == 1  # 1 of 4: within the budget
        with pytest.raises(RlcoreError, match=r"reward function .*reward\.py:compute_score failed on 2 of 4 samples "
                                              r"of this batch, more than reward\.max_failed_share = 0\.25; first: "):
            score(s, ["1", "hang", "exit", "1"])
    finally:
        s.close()
