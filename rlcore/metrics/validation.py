"""Validation metrics under verl's names (its ``process_validation_metrics``), per data source.

For each data source and each value a response is scored with (``reward``, the score, and every
numeric reward extra: ``acc``, ``format``, ...), the n responses of each prompt give:

- ``mean@n`` and, with n > 1, ``std@n`` (the spread of one prompt's n responses);
- ``best@k/mean``, ``best@k/std``, ``worst@k/mean``, ``worst@k/std`` for k = 2, 4, 8, ... and n: the
  best (worst) of k responses drawn with replacement from the prompt's n, bootstrapped
  (``BOOTSTRAP`` draws); ``/mean`` is the expected best, ``/std`` its bootstrap spread;
- ``maj@k/mean`` and ``maj@k/std`` where the reward gives each response a ``pred`` (its extracted
  answer): the value of the most common answer among k drawn responses.

Each is averaged over the data source's prompts. ``val-core/`` holds the headline ones, for
``reward`` and ``acc``: mean, maj and best at the largest n (their ``/std`` too, as in verl); everything else is ``val-aux/``. (verl
puts only ``acc`` in val-core when a reward reports it; rlcore keeps ``reward`` there too, so that
the reward's own mean stays a headline number.)
"""

from __future__ import annotations

from collections import Counter

import numpy as np

CORE_VALUES = ("reward", "acc")
BOOTSTRAP = 1000


def subset_sizes(n: int) -> list[int]:
    """2, 4, 8, ... below n, then n: the k of best@k, worst@k and maj@k."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def _bootstrap(draws: np.ndarray, reduce) -> tuple[float, float]:
    """Mean and std over bootstrap draws (rows of indices) of ``reduce`` applied to each draw."""
    results = np.array([reduce(row) for row in draws], dtype=np.float64)
    return float(results.mean()), float(results.std())


def prompt_metrics(values: list[float], preds: list | None, rng: np.random.Generator) -> dict[str, float]:
    """One prompt's metrics from the values of its n responses (and their answers, for maj@k)."""
    data = np.asarray(values, dtype=np.float64)
    n = len(data)
    metrics = {f"mean@{n}": float(data.mean())}
    if n == 1:
        return metrics
    metrics[f"std@{n}"] = float(data.std())
    for k in subset_sizes(n):
        draws = rng.integers(0, n, size=(BOOTSTRAP, k))
        picked = data[draws]  # (BOOTSTRAP, k)
        best, worst = picked.max(axis=1), picked.min(axis=1)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = float(best.mean()), float(best.std())
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = float(worst.mean()), float(worst.std())
        if preds is not None:
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = _bootstrap(
                draws, lambda row: _majority_value(row, data, preds))
    return metrics


def _majority_value(indices, data: np.ndarray, preds: list) -> float:
    """The value of the first response whose answer is the most common among ``indices`` (verl's tie
    rule: the answer seen first wins)."""
    counts = Counter(preds[i] for i in indices)
    winner = max(counts, key=counts.get)  # max keeps the first of equal counts, in order of appearance
    return float(data[next(i for i in indices if preds[i] == winner)])


def _section(name: str, metric: str, n_max: int) -> str:
    headline = metric.startswith(("mean@", "maj@", "best@")) and metric.split("@")[1].split("/")[0] == str(n_max)
    return "val-core" if name in CORE_VALUES and headline else "val-aux"


def validation_metrics(batch, extras: tuple[str, ...], n: int, seed: int = 42) -> dict[str, float]:
    """The metrics above for a scored validation batch: rows ``data_source``, ``uid`` (one per prompt),
    ``score``, each of ``extras`` (NaN where a response lacks it) and, if present, ``pred``."""
    rng = np.random.default_rng(seed)
    sources = batch["data_source"]
    uids = batch["uid"] if "uid" in batch else [i // n for i in range(len(sources))]
    preds = batch["pred"] if "pred" in batch else None
    groups: dict[str, dict[object, list[int]]] = {}
    for i, (source, uid) in enumerate(zip(sources, uids)):
        groups.setdefault(source, {}).setdefault(uid, []).append(i)
    metrics: dict[str, float] = {}
    for source in sorted(groups):
        for key in ("score", *extras):
            name = "reward" if key == "score" else key
            per_prompt = []
            for rows in groups[source].values():
                kept = [i for i in rows if float(batch[key][i]) == float(batch[key][i])]  # NaN: not reported
                if kept:
                    per_prompt.append(prompt_metrics([float(batch[key][i]) for i in kept],
                                                     [preds[i] for i in kept] if preds is not None else None, rng))
            if not per_prompt:
                continue
            n_max = max(int(m.split("@")[1].split("/")[0]) for p in per_prompt for m in p)
            for metric in sorted({m for p in per_prompt for m in p}):
                values = [p[metric] for p in per_prompt if metric in p]
                metrics[f"{_section(name, metric, n_max)}/{source}/{name}/{metric}"] = sum(values) / len(values)
    return metrics


# --- the job's checks of validation (registered by rlcore.builtins) ----------------------------------


def validation_problems(job) -> list[str]:
    if job.config.trainer.val_only and not job.config.data.val_files:
        return ["trainer.val_only validates and stops, but there is no validation data: set data.val_files"]
    return []


def validation_unused(job) -> list[str]:
    if job.config.data.val_files:
        return []
    return [f"{key} has no effect without validation data (data.val_files)"
            for key in job.given("trainer.log_val_generations") + job.given("trainer.validation_data_dir")]
