"""Geometry3K (``hiyouga/geometry3k``), verl's ``geo3k`` rule: a format part and an accuracy part.

- format: the whole response is ``<think>...</think>`` followed somewhere by ``\\boxed{...}`` (1.0 or 0.0);
- accuracy: the content of the last ``\\boxed{}`` is graded against the ground truth by
  ``rlcore.rewards.grader.grade_answer`` (mathruler's rules, which verl's scorer calls; 1.0 or 0.0);
- score: ``(1 - format_weight) * accuracy + format_weight * format``, ``format_weight`` 0.1 as in verl
  (verl's ``format_score`` argument; named apart so that ``reward.format_score``, which rlcore passes to a
  function with an argument of that name, does not change it, as verl's config does not).

Returns ``{"score", "acc", "format", "pred"}`` (``pred``: the boxed answer, None without one).
"""

from __future__ import annotations

import re

from rlcore.rewards.grader import boxed_content, grade_answer

DATA_SOURCE = "hiyouga/geometry3k"
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(solution_str: str) -> float:
    """1.0 when the response reasons in ``<think></think>`` and then gives a ``\\boxed{}`` answer."""
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def accuracy_reward(solution_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the boxed answer (the whole response with ``use_boxed=False``) is right."""
    # without a closed \boxed{}, mathruler grades the text "None", as verl does
    answer = boxed_content(solution_str) if use_boxed else solution_str
    answer = "None" if answer is None else answer
    return 1.0 if grade_answer(answer, str(ground_truth)) else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, use_boxed: bool = True,
                  format_weight: float = 0.1, **kwargs) -> dict[str, float | str | None]:
    """Score one response to a Geometry3K problem (see the module docstring)."""
    accuracy = accuracy_reward(solution_str, ground_truth, use_boxed)
    formatted = format_reward(solution_str)
    return {"score": (1.0 - format_weight) * accuracy + format_weight * formatted, "acc": accuracy,
            "format": formatted, "pred": boxed_content(solution_str)}
