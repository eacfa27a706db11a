"""The synthetic arithmetic task (``rlcore data arithmetic``): pays the right final number anywhere.

A weak model rarely writes ``#### n``, so a reward that only pays that form gives no signal. Here the
answer is the number after the last ``####`` when there is one, else the last number in the text:
- right, in the ``#### n`` form: 1.0
- right, without it: ``extra_info["unformatted_score"]`` (default 0.8; the data generator sets it)
- wrong, in the ``#### n`` form: ``format_score``
- no number, or a wrong one without the form: 0.
Returns ``{"score", "acc", "format", "pred"}``: ``acc`` is 1.0 when the answer is right in either form;
``pred`` is the answer found (without thousands commas; None without one), for validation's ``maj@k``.
"""

from __future__ import annotations

import math
import re

DATA_SOURCE = "rlcore/arithmetic"
DEFAULT_UNFORMATTED_SCORE = 0.8
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
_MARKED = re.compile(r"####[\s*$]*(" + _NUMBER + ")")  # "#### 7", "#### $7", "#### **7**"
_ANY = re.compile(_NUMBER)


def extract_answer(solution_str: str) -> tuple[str | None, bool]:
    """(the answer, whether it stood after ``####``); (None, False) when the text has no number."""
    marked = _MARKED.findall(solution_str)
    if marked:
        return marked[-1], True
    numbers = _ANY.findall(solution_str)
    return (numbers[-1], False) if numbers else (None, False)


def same_number(answer: str, ground_truth) -> bool:
    try:
        return math.isclose(float(answer.replace(",", "")), float(str(ground_truth).replace(",", "")),
                            rel_tol=0.0, abs_tol=1e-9)
    except ValueError:
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score: float = 0.0,
                  **kwargs) -> dict[str, float]:
    """Score one response to an arithmetic problem (see the module docstring)."""
    answer, formatted = extract_answer(solution_str)
    correct = answer is not None and same_number(answer, ground_truth)
    if correct and formatted:
        score = 1.0
    elif correct:
        unformatted = (extra_info or {}).get("unformatted_score")
        score = DEFAULT_UNFORMATTED_SCORE if unformatted is None else float(unformatted)
    else:
        score = float(format_score) if formatted else 0.0
    pred = answer.replace(",", "") if answer is not None else None
    return {"score": score, "acc": float(correct), "format": float(formatted), "pred": pred}
