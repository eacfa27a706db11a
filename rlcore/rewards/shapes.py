"""The synthetic shapes task (``rlcore data shapes``): counts and names checked by rule.

The answer is the content of the last ``\\boxed{}`` when there is one, else the last word of the
answer's kind in the text (a number for a count, a shape's name for "which is most numerous"):
- right, boxed: 1.0
- right, not boxed: ``extra_info["unformatted_score"]`` (default 0.5; the data generator sets it)
- wrong or absent: 0.
Returns ``{"score", "acc", "format", "pred"}``: ``acc`` is 1.0 when the answer is right either way,
``format`` when it was boxed; ``pred`` the answer read (None without one), for validation's ``maj@k``.
"""

from __future__ import annotations

import re

from rlcore.rewards.grader import boxed_content

DATA_SOURCE = "rlcore/shapes"
SHAPES = ("circle", "square", "triangle")
DEFAULT_UNFORMATTED_SCORE = 0.5
_NUMBER = re.compile(r"-?\d+")
_NAME = re.compile(r"\b(" + "|".join(SHAPES) + r")(?:e?s)?\b", re.IGNORECASE)
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def normalize(answer: str) -> str:
    """``\\text{3}`` -> ``3``, ``Circles.`` -> ``circle``, ``three`` -> ``3``."""
    text = re.sub(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}", r"\1", answer).strip().strip(".").strip().lower()
    if text in _NUMBER_WORDS:
        return str(_NUMBER_WORDS.index(text))
    name = _NAME.fullmatch(text)
    return name.group(1).lower() if name else text


def extract_answer(solution_str: str, ground_truth: str) -> tuple[str | None, bool]:
    """(the answer, whether it was boxed); the unboxed answer is the last word of the ground truth's kind."""
    boxed = boxed_content(solution_str)
    if boxed is not None:
        return normalize(boxed), True
    kind = _NUMBER if _NUMBER.fullmatch(str(ground_truth)) else _NAME
    found = kind.findall(solution_str)
    return (normalize(found[-1]) if found else None), False


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, float | str | None]:
    """Score one response to a shapes question (see the module docstring)."""
    answer, boxed = extract_answer(solution_str, str(ground_truth))
    right = answer is not None and answer == normalize(str(ground_truth))
    if right and boxed:
        score = 1.0
    elif right:
        unformatted = (extra_info or {}).get("unformatted_score")
        score = DEFAULT_UNFORMATTED_SCORE if unformatted is None else float(unformatted)
    else:
        score = 0.0
    return {"score": score, "acc": float(right), "format": float(boxed), "pred": answer}
