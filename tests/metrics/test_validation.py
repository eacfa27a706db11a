"""Validation metrics under verl's names: mean, std, best@k, worst@k, maj@k per data source."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest

from rlcore.batch import Batch
from rlcore.metrics.validation import prompt_metrics, subset_sizes, validation_metrics


def test_subset_sizes():
    assert subset_sizes(1) == [1] and subset_sizes(2) == [2] and subset_sizes(5) == [2, 4, 5]
    assert subset_sizes(8) == [2, 4, 8]


def exact_best(values, k):
    """E[max of k draws with replacement], by enumerating every draw."""
    draws = list(product(values, repeat=k))
    return sum(max(d) for d in draws) / len(draws)


def test_best_and_worst_are_the_expected_extremes_of_k_draws():
    values = [0.0, 0.0, 1.0, 0.5]
    metrics = prompt_metrics(values, None, np.random.default_rng(0))
    assert metrics["mean@4"] == pytest.approx(0.375) and metrics["std@4"] == pytest.approx(np.std(values))
    # the bootstrap's 1000 draws: within 4 standard errors of the exact expectation
    for k in (2, 4):
        assert abs(metrics[f"best@{k}/mean"] - exact_best(values, k)) < 4 * metrics[f"best@{k}/std"] / math.sqrt(1000)
        worst = 1 - exact_best([1 - v for v in values], k)
        assert abs(metrics[f"worst@{k}/mean"] - worst) < 4 * metrics[f"worst@{k}/std"] / math.sqrt(1000)
    assert "maj@2/mean" not in metrics


def exact_majority(values, preds, k):
    """E[value of the most common answer among k draws], ties to the answer drawn first, by enumeration."""
    total = 0.0
    draws = list(product(range(len(values)), repeat=k))
    for draw in draws:
        answers = [preds[i] for i in draw]
        winner = max(dict.fromkeys(answers), key=answers.count)
        total += values[next(i for i in draw if preds[i] == winner)]
    return total / len(draws)


def test_majority_takes_the_value_of_the_most_common_answer():
    values, preds = [1.0, 1.0, 1.0, 0.0], ["7", "7", "7", "3"]
    metrics = prompt_metrics(values, preds, np.random.default_rng(0))
    for k in (2, 4):
        exact = exact_majority(values, preds, k)
        assert abs(metrics[f"maj@{k}/mean"] - exact) < 4 * metrics[f"maj@{k}/std"] / math.sqrt(1000), k
    # by hand: "3" wins 13 of the 256 draws of 4 outright (3 or 4 times) and 27 ties drawn first
    assert exact_majority(values, preds, 4) == (256 - 13 - 27) / 256
    same = prompt_metrics([1.0, 1.0], ["7", "7"], np.random.default_rng(0))
    assert same["maj@2/mean"] == 1.0 and same["maj@2/std"] == 0.0


def test_metrics_per_data_source_with_the_core_and_aux_split():
    nan = float("nan")
    rows = {
        "data_source": ["a"] * 4 + ["b"] * 4,
        "uid": ["p0", "p0", "p1", "p1", "q0", "q0", "q1", "q1"],
        "score": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        "acc": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        "format": [1.0, 1.0, 1.0, 1.0, nan, nan, nan, nan],  # b's reward does not report it
    }
    metrics = validation_metrics(Batch(rows=rows), ("acc", "format"), n=2, seed=3)
    assert metrics["val-core/a/reward/mean@2"] == pytest.approx(0.75)
    assert metrics["val-core/b/acc/mean@2"] == pytest.approx(0.25)
    assert metrics["val-aux/a/reward/std@2"] == pytest.approx(0.25)  # p0: 0.5, p1: 0
    # as verl splits them: mean, maj and best at the largest n (their /std too) are val-core
    assert "val-core/a/acc/best@2/mean" in metrics and "val-core/a/acc/best@2/std" in metrics
    assert "val-aux/a/reward/worst@2/mean" in metrics
    assert metrics["val-aux/a/format/mean@2"] == 1.0 and not [k for k in metrics if "/b/format/" in k]
    # p1 and q0 have one value only: best = worst = mean for them
    assert metrics["val-core/a/reward/best@2/mean"] >= 0.75 >= metrics["val-aux/a/reward/worst@2/mean"]


def test_one_sample_per_prompt_gives_mean_at_one_as_before():
    rows = {"data_source": ["s", "s"], "uid": ["a", "b"], "score": [0.5, 1.0]}
    assert validation_metrics(Batch(rows=rows), (), n=1) == {"val-core/s/reward/mean@1": 0.75}
