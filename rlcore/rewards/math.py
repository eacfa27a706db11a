"""MATH-style answers: the content of the last ``\\boxed{...}`` (nested braces kept), normalised, compared.

1.0 when the boxed answer equals the ground truth after normalisation (or both are the same number),
else 0.0. The ground truth may itself be a ``\\boxed{}`` string or a full solution.
"""

from __future__ import annotations

import re

DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed x``); None if absent or unclosed."""
    start, command = max((text.rfind(command), command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(command):]
    if rest.startswith(" "):  # "\boxed 5": up to the next "$" or end of text
        return rest.strip().split("$")[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "^{\\circ}", "^\\circ", "\\%", "%")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize(answer: str) -> str:
    """A canonical spelling: no spaces, sizing commands, dollar or degree signs; ``dfrac`` -> ``frac``."""
    s = answer.strip()
    s = _TEXT.sub(r"\1", s)
    for token in _REMOVE:
        s = s.replace(token, "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)  # "x=5" -> "5"
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12 -> \frac{1}{2}
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", s):
        s = s.replace(",", "")
        if "." in s:
            s = s.rstrip("0").rstrip(".")
        if s.startswith("0") and len(s) > 1 and s[1] != ".":
            s = s.lstrip("0") or "0"
    return s


def is_equivalent(answer: str, ground_truth: str) -> bool:
    return normalize(answer) == normalize(ground_truth)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """1.0 if the last ``\\boxed{}`` answer matches ``ground_truth``, else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    boxed_truth = last_boxed(truth)
    if boxed_truth is not None:
        truth = boxed_truth
    return 1.0 if is_equivalent(answer, truth) else 0.0
