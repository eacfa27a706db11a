"""The console's line per step and the end-of-run summary."""

from __future__ import annotations

import io

from rlcore.config import load_job
from rlcore.metrics.progress import ProgressLine, duration, summary
from rlcore.runs.loggers import ConsoleLogger


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


STEP = {"critic/score/mean": 0.41234, "response_length/mean": 87.25, "actor/kl_loss": 0.0012,
        "actor/entropy": 0.5, "timing_share/gen": 0.623, "actor/pg_loss": -0.2, "perf/throughput": 9.0}


def test_the_line_counts_steps_time_per_step_and_time_left():
    clock = Clock()
    line = ProgressLine(("critic/score/mean", "response_length/mean", "actor/kl_loss", "actor/entropy",
                         "timing_share/gen"), clock)
    line.begin(total_steps=300, step=10)  # resumed at step 10
    clock.now += 46.0  # two steps of 23 s
    assert line.line(STEP, 12) == ("step 12/300 | 23 s/step | eta 1:50:24 | score 0.4123 | length 87.25 | "
                                   "kl 0.0012 | entropy 0.5 | gen 62%")


def test_the_validation_before_training_does_not_count_as_step_time():
    clock = Clock()
    line = ProgressLine(("critic/score/mean",), clock)
    line.begin(total_steps=20, step=0)
    clock.now += 200.0  # the validation before training
    line.line({"val-core/rlcore/arithmetic/acc/mean@1": 0.83}, 0)
    clock.now += 20.0
    assert line.line({"critic/score/mean": 0.15}, 1) == "step 1/20 | 20 s/step | eta 6:20 | score 0.15"


def test_validation_results_join_the_line_and_step_zero_says_validation():
    line = ProgressLine(("critic/score/mean",), Clock())
    line.begin(4, 0)
    assert line.line({"val-core/openai/gsm8k/reward/mean@1": 0.25, "val-aux/openai/gsm8k/format/mean@1": 1.0}, 0) \
        == "step 0/4 | validation | val-core/openai/gsm8k/reward/mean@1 0.25"


def test_the_console_logger_uses_the_configured_keys_and_no_terminal():
    job = load_job(None, ['trainer.console_metrics=["actor/pg_loss", "perf/throughput"]'], check=False)
    stream = io.StringIO()  # not a terminal: the line is printed all the same
    logger = ConsoleLogger(job.config, None, stream=stream)
    logger.begin(5, 0)
    logger.log(STEP, 1)
    text = stream.getvalue()
    assert text.startswith("step 1/5 | ") and text.endswith(" | pg_loss -0.2 | perf/throughput 9\n")
    assert "score" not in text


def test_duration():
    assert [duration(s) for s in (5, 65, 3600 + 62)] == ["5s", "1:05", "1:01:02"]


def test_summary_names_best_and_last_validation_and_the_export_command(tmp_path):
    key = "val-core/openai/gsm8k/reward/mean@1"
    text = summary(20, 20, 500, [(0, {key: 0.5}), (10, {key: 0.75}), (20, {key: 0.625})],
                   tmp_path / "global_step_20", f"rlcore export {tmp_path / 'global_step_20'} --to out")
    assert text.splitlines() == [
        "run finished: 20/20 steps in 8:20",
        f"  {key}: last 0.625 (step 20), best 0.75 (step 10)",
        f"  checkpoint: {tmp_path / 'global_step_20'}",
        f"  export: rlcore export {tmp_path / 'global_step_20'} --to out",
    ]


def test_summary_without_validation_checkpoint_or_export(tmp_path):
    assert "no validation" in summary(3, 3, 10, [], None, None)
    assert "no checkpoint saved" in summary(3, 3, 10, [], None, None)
    assert "this backend has no `rlcore export`" in summary(3, 3, 10, [], tmp_path, None)


def test_timing_per_token_and_the_generation_share():
    import torch

    from rlcore.batch import Batch
    from rlcore.metrics.step import timing_metrics

    batch = Batch({"response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),  # 3 response tokens
                   "attention_mask": torch.ones(2, 5, dtype=torch.long)})  # 10 tokens
    metrics = timing_metrics(batch, {"step": 4.0, "gen": 3.0, "update_actor": 0.5})
    assert metrics == {"timing_per_token_ms/gen": 1000.0, "timing_per_token_ms/update_actor": 50.0,
                       "timing_share/gen": 0.75}


def test_memory_metrics_from_the_platform_and_the_worst_worker():
    from rlcore.metrics.step import memory_metrics, worst_memory

    class Fake:
        def memory_stats(self):
            return {"allocated": 1, "reserved": 2**30, "peak_allocated": 3 * 2**29, "total": 2**34}

    metrics = memory_metrics(Fake())
    assert metrics["perf/max_memory_allocated_gb"] == 1.5 and metrics["perf/max_memory_reserved_gb"] == 1.0
    assert 0 < metrics["perf/cpu_memory_used_gb"] < 2**20  # this machine's, in GB
    assert worst_memory([{"a": 1.0, "b": 5.0}, {"a": 3.0}]) == {"a": 3.0, "b": 5.0}
