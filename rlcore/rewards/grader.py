"""Grading a math answer against a ground truth, as ``mathruler.grader.grade_answer`` (what verl's
``geo3k`` scorer calls) does, in rlcore's own code: the answer is right when

1. both normalise to the same string under the MATH dataset's rules (Hendrycks et al.), or
2. both normalise to the same string under PRM800K's rules (units, ``\\text{}``, LaTeX to plain
   text), or
3. element by element (a tuple or interval is split), sympy simplifies their difference to 0; an
   integer ground truth needs an integer answer, and fractions of integers must match as written.

The LaTeX-to-text step covers the commands of math answers (``\\frac``, ``\\sqrt``, ``\\pi``, Greek
letters, ``\\cdot``, ``\\times``, text and font commands; other commands are dropped and their
arguments kept, as pylatexenc's ``latex2text`` does), so that rlcore needs neither mathruler nor
pylatexenc. ``tests/rewards/test_geo3k_reward.py`` compares it with mathruler on the same strings.
"""

from __future__ import annotations

import re

# -- 1. the MATH dataset's normalisation --------------------------------------------------------------


def _braced_fracs(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` -> ``\frac{1}{72}``; unchanged when too short."""
    head, *tails = text.split("\\frac")
    out = head
    for tail in tails:
        out += "\\frac"
        if tail[0] == "{":  # an empty tail raises IndexError: the caller keeps the answer as it was
            out += tail
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            out += "{" + tail[0] + "}" + tail[1:]
        else:
            out += "{" + tail[0] + "}{" + tail[1] + "}" + tail[2:]
    return out


def _braced_sqrts(text: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``."""
    head, *tails = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (tail if tail[0] == "{" else "{" + tail[0] + "}" + tail[1:]) for tail in tails)


def _slash_as_frac(text: str) -> str:
    r"""``3/4`` -> ``\frac{3}{4}`` for two plain integers."""
    parts = text.split("/")
    if len(parts) == 2 and all(re.fullmatch(r"\s*[+-]?\d+\s*", p) for p in parts):
        a, b = (int(p) for p in parts)
        if text == f"{a}/{b}":
            return f"\\frac{{{a}}}{{{b}}}"
    return text


def mathd_normalize(answer: str) -> str:
    """The MATH dataset's canonical spelling of an answer."""
    answer = answer.strip()
    text = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
    if text is not None:
        answer = text.group("text").strip()
    try:
        return _mathd_strip(answer)
    except (IndexError, ValueError):  # a command without its argument: left as it is
        return answer


def _mathd_strip(s: str) -> str:
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    if "\\text{ " in s:  # units on the right
        before, *after = s.split("\\text{ ")
        if len(after) != 1:
            raise ValueError("several unit texts")
        s = before
    s = s.replace("\\%", "").replace("%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5" -> " 5"
        s = sides[1]
    s = _braced_fracs(_braced_sqrts(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_as_frac(s)


# -- 2. PRM800K's normalisation, with LaTeX turned into plain text -------------------------------------

_SYMBOLS = {
    "pi": "π", "infty": "∞", "cup": "∪", "cap": "∩", "cdot": "·", "times": "×", "div": "÷", "pm": "±", "mp": "∓",
    "circ": "∘", "angle": "∠", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈",
    "in": "∈", "ldots": "…", "dots": "…", "cdots": "⋯", "degree": "°", "prime": "′", "perp": "⊥", "parallel": "∥",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ", "eta": "η",
    "theta": "θ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "rho": "ρ", "sigma": "σ",
    "tau": "τ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Delta": "Δ",
    "Theta": "Θ", "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Omega": "Ω",
    **{name: name for name in ("sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "log", "ln",
                               "exp", "lim", "max", "min", "gcd", "det", "deg", "mod")},
}
_ESCAPES = {" ": " ", ",": " ", ";": " ", ":": " ", "!": "", "{": "{", "}": "}", "%": "%", "$": "$", "_": "_",
            "&": "&", "#": "#", "\\": "\n"}


class _Latex:
    """A small reader of LaTeX math: ``text()`` renders from the position to the end or a closing brace."""

    def __init__(self, source: str):
        self.source, self.at = source, 0

    def text(self, stop_at_brace: bool = False) -> str:
        out = []
        while self.at < len(self.source):
            if self.source[self.at] == "}" and stop_at_brace:
                self.at += 1
                return "".join(out)
            out.append(self.token())
        return "".join(out)

    def token(self) -> str:
        char = self.source[self.at]
        self.at += 1
        if char == "{":
            return self.text(stop_at_brace=True)
        if char == "$":
            return ""
        if char == "~":
            return "\xa0"
        if char != "\\":
            return char
        name = re.match(r"[A-Za-z]+", self.source[self.at:])
        if name is None:  # a control symbol: \{, \%, \, ...
            symbol = self.source[self.at:self.at + 1]
            self.at += 1
            return _ESCAPES.get(symbol, symbol)
        self.at += name.end()
        while self.at < len(self.source) and self.source[self.at].isspace():  # a command eats the space after it
            self.at += 1
        return self.command(name.group())

    def argument(self) -> str:
        while self.at < len(self.source) and self.source[self.at].isspace():
            self.at += 1
        if self.at >= len(self.source):
            raise ValueError("a command without its argument")
        return self.token()

    def command(self, name: str) -> str:
        if name in ("frac", "dfrac", "tfrac"):
            numerator = self.argument()
            return f"{numerator}/{self.argument()}"
        if name == "sqrt":
            if self.source.startswith("[", self.at):  # the root's degree is dropped
                self.at = self.source.index("]", self.at) + 1
            return f"√({self.argument()})"
        # \left, \right, fonts, \text and unknown commands leave nothing; their arguments follow as groups
        return _SYMBOLS.get(name, "")


def latex_to_text(expr: str) -> str:
    """Plain text of a LaTeX math answer, spelled for sympy: ``\\frac{1}{2}\\pi`` -> ``1/2pi``."""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = _Latex(expr).text()
    for old, new in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(old, new)
    return text.strip()


_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard")


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_integral(value: float) -> bool:
    try:
        return abs(value - int(round(value))) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _drop_thousands_commas(expr: str) -> str:
    """``1,000,000`` -> ``1000000``, leaving a tuple's commas."""
    while True:
        dropped = re.sub(r"(\d)(,)(\d\d\d)($|\D)", r"\1\3\4", expr)
        if dropped == expr:
            return expr
        expr = dropped


def _integer_text(expr: str) -> bool:
    value = _float_or_none(_drop_thousands_commas(expr))
    return value is not None and _is_integral(value)


def prm_normalize(expr: str) -> str:
    """PRM800K's canonical spelling: no units, dollars or percent, LaTeX as plain text, lower case."""
    text = re.search(r"^\\text\{(?P<text>.+?)\}$", expr)
    if text is not None:
        expr = text.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                     ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    for unit in _UNITS:
        expr = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _float_or_none(expr)
    if value is not None and _is_integral(value):
        expr = str(int(round(value)))
    if "\\" in expr:
        try:
            expr = latex_to_text(expr)
        except (ValueError, IndexError):  # LaTeX it cannot read stays as written
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # a mixed number: 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _integer_text(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


# -- 3. sympy ------------------------------------------------------------------------------------------


def _safe_to_evaluate(expr: str) -> bool:
    """sympy may hang on towers of powers or on text; those are not tried. At most two distinct letters
    also keeps the ``eval`` inside sympy's ``parse_expr`` from ever seeing a name such as ``import``."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    return (len(letters) <= 2 and "^{" not in expr and "^(" not in expr
            and not re.search(r"\^[0-9]+\^", expr) and not re.search(r"\^[0-9][0-9]+", expr))


def equal_under_sympy(ground_truth: str, given: str) -> bool:
    expr = f"({ground_truth})-({given})"
    if not _safe_to_evaluate(expr):
        return False
    try:
        import sympy
        from sympy.parsing import sympy_parser

        transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
        return sympy.simplify(sympy_parser.parse_expr(expr.replace("^", "**"),
                                                      transformations=transformations)) == 0
    except Exception:  # noqa: BLE001 - text sympy cannot parse is simply not equal
        return False


def _elements(expr: str) -> list[str]:
    """A tuple's or interval's elements (``(1,2]`` -> ``1``, ``2``); otherwise the expression itself."""
    expr = _drop_thousands_commas(expr)
    if not expr:
        return []
    brackets = "()[]"
    if len(expr) > 2 and expr[0] in brackets and expr[-1] in brackets and not any(c in brackets for c in expr[1:-1]):
        return [element.strip() for element in expr[1:-1].split(",")]
    return [expr]


def _is_fraction(expr: str) -> bool:
    return re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", expr) is not None


def grade_answer(given: str | None, ground_truth: str) -> bool:
    """Whether ``given`` answers ``ground_truth`` (see the module docstring)."""
    if given is None:
        return False
    if mathd_normalize(ground_truth) == mathd_normalize(given):
        return True
    truth, answer = prm_normalize(ground_truth), prm_normalize(given)
    if truth == answer:
        return True
    if not answer:
        return False
    truth_elements, answer_elements = _elements(truth), _elements(answer)
    if len(truth_elements) > 1 and (truth[0] != answer[0] or truth[-1] != answer[-1]):
        return False  # an interval's brackets must match
    if len(truth_elements) != len(answer_elements):
        return False
    for expected, element in zip(truth_elements, answer_elements):
        if _is_fraction(expected) and _is_fraction(element):
            right = expected == element  # an unreduced fraction is not the reduced one
        elif _integer_text(expected) != _integer_text(element):
            right = False  # an integer must be given as an integer
        else:
            right = equal_under_sympy(expected, element)
        if not right:
            return False
    return True


def boxed_content(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (nested braces kept, stripped); None when there is none
    or it is not closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    content = text[start + len("\\boxed{"):]
    for i, char in enumerate(content):
        depth += (char == "{") - (char == "}")
        if depth == -1:
            return content[:i].strip()
    return None
