"""GSM8K, verl's rule: the number after the last ``#### `` is the answer, compared as a string.

Correct: ``score`` (1.0); a ``#### number`` that is wrong: ``format_score``; no ``#### number``: 0.
Only the last 300 characters are searched, as verl does (the answer stands at the end). Besides the
score, each sample reports ``acc`` (the answer is right) and ``format`` (a ``#### number`` is there),
which validation and the training metrics show apart.
"""

from __future__ import annotations

import re

DATA_SOURCE = "openai/gsm8k"
_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer in ``solution_str``: after ``#### `` (strict) or the last number (flexible)."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    for candidate in reversed(_FLEXIBLE.findall(text)):
        if candidate not in ("", "."):
            return candidate
    return None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0, **kwargs) -> dict[str, float]:
    """``score``: 1.0 for the right answer after ``####``, ``format_score`` for a wrong one, 0 without
    one; ``acc``: 1.0 when right; ``format``: 1.0 when a ``#### number`` was found; ``pred``: the
    answer found (None without one), which validation's ``maj@k`` votes on."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "format": 0.0, "pred": None}
    right = answer == str(ground_truth)
    return {"score": score if right else format_score, "acc": float(right), "format": 1.0, "pred": answer}
