"""The whole-job tests' metrics reader refuses what a diverged job logs (NaN, infinity: null in
metrics.jsonl), so every whole-job test checks that its metrics are finite."""

from __future__ import annotations

import math

import pytest

from rlcore.config.schema import JobConfig
from rlcore.runs.loggers import JsonlLogger
from tests.e2e.conftest import read_metrics


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_metric_fails_the_reader(tmp_path, value):
    logger = JsonlLogger(JobConfig(), tmp_path)
    logger.log({"actor/pg_loss": 0.5, "critic/score/mean": 1.0}, step=1)
    logger.log({"actor/pg_loss": value, "critic/score/mean": 1.0}, step=2)
    logger.close()
    with pytest.raises(AssertionError, match=r"non-finite metrics at step 2 .*'actor/pg_loss': None"):
        read_metrics(tmp_path)


def test_finite_metrics_are_read_back(tmp_path):
    logger = JsonlLogger(JobConfig(), tmp_path)
    logger.log({"actor/pg_loss": -0.25, "training/global_step": 1}, step=1)
    logger.close()
    assert read_metrics(tmp_path) == [{"step": 1, "actor/pg_loss": -0.25, "training/global_step": 1}]
