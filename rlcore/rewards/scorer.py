"""``RewardScorer``: scores responses with the function registered for each sample's ``data_source``
(or the user's custom function for every sample, as verl does) and checks what each one returns.

The calls run in a supervised pool of worker processes (``rlcore.rewards.pool``; ``reward.num_workers``,
``reward.timeout_s``, ``reward.batch_timeout_s``), so a function that hangs, exits or kills its
process costs its sample, not the job; ``reward.num_workers = 0`` calls them in the driver, where a
debugger can step into them."""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from rlcore.errors import RlcoreError, UnknownNameError, check_failed_share, describe_exit
from rlcore.plugins.registry import Registry
from rlcore.rewards.config import RewardConfig
from rlcore.rewards.custom import load_reward_function
from rlcore.rewards.pool import FileFunction, Outcome, RewardPool

logger = logging.getLogger(__name__)


@attrs.frozen
class RewardResult:
    """Scores of one batch of responses."""

    scores: torch.Tensor  # (B,) float32
    extra: dict[str, list[float]]  # numeric extras of functions returning a dict, per sample (NaN: absent)
    metrics: dict[str, float]  # "reward/errors" when reward.on_error = "zero"; the pool's timings
    # the answer each response gave (a function's "pred", as text; None where it gave none), for
    # validation's maj@k; None when no response had one
    preds: list[str | None] | None = None


class _BadReturn(Exception):
    """A reward function returned something that is not a score."""


def _as_number(value: Any) -> float | None:
    """A finite float from int, float, bool, or a one-element numpy/torch value; None otherwise."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes, dict)):
        try:
            value = value.item()
        except (ValueError, RuntimeError, TypeError):
            return None
    if isinstance(value, (bool, numbers.Real)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _parse(value: Any) -> tuple[float, dict[str, float]]:
    """(score, numeric extras) from a number or a dict with a numeric "score"."""
    if isinstance(value, dict):
        if "score" not in value:
            raise _BadReturn(f"returned a dict without a 'score' key (keys: {', '.join(map(str, value))})")
        score = _as_number(value["score"])
        if score is None:
            raise _BadReturn(f"returned a dict whose 'score' is {value['score']!r}, not a finite number")
        # Non-numeric extras (verl's DAPO scorer returns "pred" strings) are left out, not rejected.
        extras = {str(k): n for k, v in value.items() if k != "score" and (n := _as_number(v)) is not None}
        return score, extras
    score = _as_number(value)
    if score is None:
        raise _BadReturn(f"returned {value!r} ({type(value).__name__}), not a finite number")
    return score, {}


def _pred(value: Any) -> str | None:
    """The answer a reward function extracted (its dict's ``"pred"``), as text; None without one."""
    if not isinstance(value, dict) or value.get("pred") is None:
        return None
    pred = value["pred"]
    return pred if isinstance(pred, str) else str(pred)


def _label(function: Callable) -> str:
    return f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', repr(function))}"


class RewardScorer:
    """Picks a reward function per sample and turns its results into a (B,) score tensor."""

    def __init__(self, reward_config: RewardConfig, reward_functions: Registry):
        self.config = reward_config
        self.reward_functions = reward_functions
        self._custom, self._custom_label = self._load_custom()
        self._pool: RewardPool | None = None  # started at the first batch
        self._said_in_driver: set[str] = set()

    def _load_custom(self) -> tuple[Callable | None, str | None]:
        custom = self.config.custom_reward_function
        if custom.path is None:
            return None, None
        return load_reward_function(custom.path, custom.name), f"{custom.path}:{custom.name}"

    def close(self) -> None:
        """Stop the worker processes (a later ``score`` starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _reference(self, function: Callable, label: str):
        """What a worker is sent for ``function``; None where it must run in the driver."""
        if self.config.num_workers == 0:
            return None
        if function is self._custom:
            custom = self.config.custom_reward_function
            return FileFunction(str(custom.path), custom.name)
        try:
            pickle.dumps(function)
            return function
        except Exception:  # noqa: BLE001 - a lambda or a local function: not importable by name
            if label not in self._said_in_driver:
                logger.warning("reward function %s cannot be sent to a reward worker (it is not importable by "
                               "name); it runs in the driver, without reward.timeout_s", label)
                self._said_in_driver.add(label)
            return None

    def _call_in_driver(self, function: Callable, kwargs: dict) -> Outcome:
        start = time.perf_counter()
        try:
            return Outcome(True, function(**kwargs), time.perf_counter() - start)
        # SystemExit too: a function that calls sys.exit() must fail the job, not end it as a success.
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's code may raise anything
            problem = describe_exit(exc) if isinstance(exc, SystemExit) else f"raised {type(exc).__name__}: {exc}"
            return Outcome(False, problem, time.perf_counter() - start)

    def _outcomes(self, calls: list[tuple[Callable, Any, dict]]) -> list[Outcome]:
        """Run ``(function, worker reference or None, kwargs)`` calls: in the pool where they can go."""
        outcomes: list[Outcome | None] = [None] * len(calls)
        pooled = [i for i, (_, reference, _) in enumerate(calls) if reference is not None]
        if pooled:
            if self._pool is None:
                config = self.config
                self._pool = RewardPool(config.num_workers, config.timeout_s, config.batch_timeout_s or None)
            def report(position: int, outcome: Outcome) -> None:  # at once, not after the batch's slowest call
                i = pooled[position]
                function = calls[i][0]
                label = self._custom_label if function is self._custom else _label(function)
                logger.warning("reward function %s %s on sample %d after %.1f s (data_source %r)%s",
                               label, outcome.value, i, outcome.seconds, calls[i][2].get("data_source"),
                               "; the sample scores 0 (reward.on_error = 'zero')" if self.config.on_error == "zero"
                               else "; the job stops after this batch (reward.on_error = 'raise')")

            for i, outcome in zip(pooled, self._pool.run([(calls[i][1], calls[i][2]) for i in pooled], report)):
                outcomes[i] = outcome
        for i, (function, reference, kwargs) in enumerate(calls):
            if reference is None:
                outcomes[i] = self._call_in_driver(function, kwargs)
        return outcomes

    def _batch_outcomes(self, calls: list[tuple[Callable, Any, dict]]) -> list[Outcome]:
        """The calls as one call with lists (verl's batch reward manager); its list of results, one
        per sample, or its failure for every sample."""
        if not calls:
            return []
        function, reference, _ = calls[0]
        lists = {plural: [kwargs[one] for _, _, kwargs in calls] for one, plural in (
            ("data_source", "data_sources"), ("solution_str", "solution_strs"), ("ground_truth", "ground_truths"),
            ("extra_info", "extra_infos"))}
        (outcome,) = self._outcomes([(function, reference, lists)])
        if not outcome.ok:
            return [outcome] * len(calls)
        values = outcome.value
        if not isinstance(values, (list, tuple)) or len(values) != len(calls):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
            problem = (f"(called once with the batch, reward.custom_reward_function.batch) returned {got}, not a "
                       f"list of {len(calls)} scores")
            return [Outcome(False, problem, outcome.seconds)] * len(calls)
        return [Outcome(True, value, outcome.seconds, outcome.timed_out) for value in values]

    def __getstate__(self) -> dict:  # a function loaded from a file is re-loaded, not pickled
        return {"config": self.config, "reward_functions": self.reward_functions}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["config"], state["reward_functions"])

    def check_sources(self, rows: Sequence[dict]) -> None:
        """Before anything starts: every ``data_source`` of the data (rows with ``data_source``,
        ``file``, ``row``) has a reward function; an unknown one is named with where it first occurs."""
        first: dict[str, dict] = {}
        for row in rows:
            first.setdefault(row["data_source"], row)
        for source, row in first.items():
            try:
                self.function_for(source)
            except UnknownNameError as exc:
                raise UnknownNameError(f"{row.get('file', 'the data')}, row {row.get('row', '?')}: {exc}") from None

    def function_for(self, data_source: str) -> tuple[Callable, str, dict[str, Any]]:
        """(function, its label for errors, the keyword arguments it is given) for a data source."""
        if self._custom is not None:
            return self._custom, self._custom_label, {}
        try:
            function = self.reward_functions.get(data_source)
        except UnknownNameError as exc:
            raise UnknownNameError(
                f"no reward function for data_source {data_source!r}: {exc} "
                "Set reward.custom_reward_function.path to score it with your own function.") from None
        kwargs = {}
        try:
            if "format_score" in inspect.signature(function).parameters:
                kwargs["format_score"] = self.config.format_score
        except (TypeError, ValueError):  # no inspectable signature: call it plainly
            pass
        return function, _label(function), kwargs

    def score(self, data_sources: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any],
              extra_infos: Sequence[dict | None] | None = None) -> RewardResult:
        """Score each response; a failing function stops with RlcoreError unless ``on_error = "zero"``."""
        size = len(responses)
        extra_infos = [None] * size if extra_infos is None else list(extra_infos)
        if not len(data_sources) == len(ground_truths) == len(extra_infos) == size:
            raise ValueError(f"score() got {len(data_sources)} data sources, {size} responses, "
                             f"{len(ground_truths)} ground truths and {len(extra_infos)} extra infos")
        functions: dict[str, tuple[Callable, str, dict, Any]] = {}
        calls = []
        for source, response, truth, info in zip(data_sources, responses, ground_truths, extra_infos):
            if source not in functions:
                function, label, kwargs = self.function_for(source)
                functions[source] = (function, label, kwargs, self._reference(function, label))
            function, _, kwargs, reference = functions[source]
            calls.append((function, reference, dict(data_source=source, solution_str=response, ground_truth=truth,
                                                    extra_info=info, **kwargs)))
        batched = self._custom is not None and self.config.custom_reward_function.batch
        outcomes = self._batch_outcomes(calls) if batched else self._outcomes(calls)
        scores: list[float] = []
        extras: list[dict[str, float]] = []
        preds: list[str | None] = []
        errors: list[str] = []
        failed: set[str] = set()  # the labels of the functions that failed
        for i, (source, response, outcome) in enumerate(zip(data_sources, responses, outcomes)):
            label = functions[source][1]
            problem = outcome.value if not outcome.ok else None
            if problem is None:
                try:
                    score, extra = _parse(outcome.value)
                except _BadReturn as exc:
                    problem = str(exc)
            if problem is not None:
                message = (f"reward function {label} {problem} on sample {i} (data_source {source!r}, "
                           f"response {str(response)[:80]!r})")
                if self.config.on_error != "zero":
                    raise RlcoreError(f"{message}. Fix the function, or set reward.on_error = \"zero\" to score "
                                      "such samples 0 and count them in the metric reward/errors.")
                errors.append(message)
                failed.add(label)
                score, extra = 0.0, {}
            scores.append(score)
            extras.append(extra)
            preds.append(_pred(outcome.value) if problem is None else None)
        keys = list(dict.fromkeys(k for extra in extras for k in extra))
        metrics: dict[str, float] = {
            "timing_s/reward_slowest_sample": max((o.seconds for o in outcomes), default=0.0),
            "reward/timeouts": float(sum(o.timed_out for o in outcomes)),
        }
        if self.config.on_error == "zero":
            metrics["reward/errors"] = float(len(errors))
            check_failed_share(errors, size, self.config.max_failed_share, key="reward.max_failed_share",
                               subject=f"reward function {', '.join(sorted(failed))}", items="samples",
                               fix="Fix the function (or what it calls)")
            if errors:
                logger.warning("%d of %d samples scored 0 because their reward function failed; first: %s",
                               len(errors), size, errors[0])
        return RewardResult(
            scores=torch.tensor(scores, dtype=torch.float32),
            extra={k: [extra.get(k, math.nan) for extra in extras] for k in keys},
            metrics=metrics,
            preds=preds if any(p is not None for p in preds) else None,
        )
