"""The rule scorers of the vision tasks: Geometry3K (verl's ``geo3k`` rule, with mathruler's grading
done in rlcore's own ``rlcore.rewards.grader``) and the synthetic shapes task, case by case; the
Geometry3K scorer and the grader also against verl's ``verl.utils.reward_score.geo3k`` and
``mathruler.grader`` themselves on the same strings. Outside CI a missing verl or mathruler skips those
comparisons, saying why; under ``.ci/run`` (``RLCORE_CI=1``) it fails."""

from __future__ import annotations

import pytest

from rlcore.plugins.manager import PluginManager
from rlcore.rewards import geo3k, grader, shapes
from tests.conftest import IN_CI

GEO3K = "hiyouga/geometry3k"
THINK = "<think>The angles sum to 180.</think> "


@pytest.mark.parametrize("response, truth, acc, formatted", [
    (THINK + "So x = \\boxed{3}.", "3", 1.0, 1.0),
    (THINK + "\\boxed{3.0}", "3", 1.0, 1.0),  # an integral float is the integer
    (THINK + "\\boxed{\\sqrt{884}}", "2\\sqrt{221}", 1.0, 1.0),  # sympy: sqrt(884) - 2 sqrt(221) = 0
    (THINK + "\\boxed{29.73}", "2\\sqrt{221}", 0.0, 1.0),  # a rounded value is not the root
    (THINK + "\\boxed{\\dfrac{40}{3}}", "\\frac{40}{3}", 1.0, 1.0),
    (THINK + "\\boxed{40/3}", "\\frac{40}{3}", 1.0, 1.0),
    (THINK + "\\boxed{\\frac{80}{6}}", "\\frac{40}{3}", 0.0, 1.0),  # an unreduced fraction is wrong
    (THINK + "\\boxed{60^\\circ}", "60", 1.0, 1.0),
    (THINK + "\\boxed{5 cm}", "5", 1.0, 1.0),
    (THINK + "\\boxed{4\\pi}", "4 \\pi", 1.0, 1.0),
    (THINK + "\\boxed{2} then \\boxed{3}", "3", 1.0, 1.0),  # the last box counts
    ("x is \\boxed{3}", "3", 1.0, 0.0),  # right, but no <think> block
    (THINK + "x is 3", "3", 0.0, 0.0),  # no box: graded as the text "None"
    (THINK + "\\boxed{4", "4", 0.0, 0.0),  # an unclosed box is none
    ("\\boxed{7} <think>late</think>", "7", 1.0, 0.0),  # the box must follow the thinking
])
def test_geo3k_is_verls_rule(response, truth, acc, formatted):
    result = geo3k.compute_score(GEO3K, response, truth)
    assert result["acc"] == acc and result["format"] == formatted
    assert result["score"] == pytest.approx(0.9 * acc + 0.1 * formatted)
    assert result["pred"] == grader.boxed_content(response)


def test_geo3k_options_and_registration():
    """verl calls its geo3k scorer with the format weight fixed at 0.1; rlcore's scorer passes
    reward.format_score only to a function with an argument of that name, which this one has not."""
    import inspect

    assert "format_score" not in inspect.signature(geo3k.compute_score).parameters
    assert geo3k.compute_score(GEO3K, "2\\sqrt{221}", "\\sqrt{884}", use_boxed=False)["score"] == pytest.approx(0.9)
    assert geo3k.compute_score(GEO3K, THINK + "\\boxed{1}", "1", format_weight=0.0)["score"] == 1.0
    assert geo3k.compute_score(GEO3K, "\\boxed{1}", "1", format_weight=0.0)["score"] == 1.0
    registry = PluginManager().registry("reward_functions")
    assert registry.get(GEO3K) is geo3k.compute_score and registry.get("rlcore/shapes") is shapes.compute_score


@pytest.mark.parametrize("response, truth, score, acc, boxed", [
    ("I see three shapes: \\boxed{3}", "3", 1.0, 1.0, 1.0),
    ("\\boxed{\\text{3}}", "3", 1.0, 1.0, 1.0),
    ("\\boxed{three}", "3", 1.0, 1.0, 1.0),
    ("\\boxed{4}", "3", 0.0, 0.0, 1.0),
    ("There are 2 circles and 3 shapes in all, so 3", "3", 0.5, 1.0, 0.0),  # the last number, unboxed
    ("There are 3 shapes, 2 of them circles", "3", 0.0, 0.0, 0.0),
    ("\\boxed{Circles.}", "circle", 1.0, 1.0, 1.0),
    ("Mostly squares, fewer circles. Answer: triangle", "triangle", 0.5, 1.0, 0.0),
    ("Squares, I think", "triangle", 0.0, 0.0, 0.0),
    ("no idea", "2", 0.0, 0.0, 0.0),
])
def test_shapes_scorer(response, truth, score, acc, boxed):
    result = shapes.compute_score("rlcore/shapes", response, truth, {"unformatted_score": 0.5})
    assert (result["score"], result["acc"], result["format"]) == (score, acc, boxed)


def test_shapes_unformatted_score_comes_from_the_row():
    assert shapes.compute_score("rlcore/shapes", "it is 3", "3", {"unformatted_score": 0.2})["score"] == 0.2
    assert shapes.compute_score("rlcore/shapes", "it is 3", "3")["score"] == shapes.DEFAULT_UNFORMATTED_SCORE


# -- against verl's scorer and mathruler, on the same strings ------------------------------------------

ANSWERS = [  # (given, ground truth): Geometry3K's forms of answers, and the grader's edge cases
    ("3", "3"), ("3.0", "3"), ("\\frac{40}{3}", "40/3"), ("13.33", "\\frac{40}{3}"), ("\\sqrt{884}", "2\\sqrt{221}"),
    ("29.73", "2\\sqrt{221}"), ("4\\pi", "4 \\pi"), ("12.57", "4\\pi"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
    ("60^\\circ", "60"), ("60 degrees", "60"), ("x=5", "5"), ("\\text{5 cm}", "5"), ("5 cm^2", "5"),
    ("(1,2)", "(1, 2)"), ("[1,2)", "(1,2)"), ("\\frac{2}{4}", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"),
    ("1,000", "1000"), ("\\dfrac{1}{2}", "1/2"), ("None", "5"), ("", "5"), ("10\\sqrt{3}", "10 \\sqrt 3"),
    ("17.3", "10\\sqrt{3}"), ("\\sqrt{300}", "10\\sqrt{3}"), ("\\frac{5\\sqrt{2}}{2}", "\\frac{5}{\\sqrt{2}}"),
    ("2.5\\sqrt{2}", "\\frac{5 \\sqrt 2}{2}"), ("\\frac{1}{2}\\pi", "\\pi/2"), ("A", "a"), ("\\text{A}", "A"),
    ("7 3/4", "31/4"), ("\\left(3,4\\right)", "(3,4)"), ("3\\%", "3"), ("\\$5", "5"), ("45^{\\circ}", "45"),
    ("\\angle 1", "1"), ("2\\sqrt{3}+1", "1+2\\sqrt{3}"), ("\\frac{a+b}{2}", "(a+b)/2"), ("8\\sqrt{2}", "11.31"),
    ("x^2", "x^{2}"), ("1/3", "\\frac13"), ("\\frac{24}{5}", "4.8"), ("4.8", "\\frac{24}{5}"), ("-3", "- 3"),
    ("5\\text{ cm}", "5"), ("\\pi r^2", "r^2\\pi"), ("\\sqrt", "2"), ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\frac{\\pi}{4}", "0.785"), ("\\tan 30", "\\tan(30)"), ("\\{1,2\\}", "(1,2)"), ("12\\sqrt{3}", "12 \\sqrt{3}"),
]


def _reference():
    """verl 0.9.1's geo3k scorer and mathruler's grader; else skip (fail in CI)."""
    try:
        from mathruler import grader as mathruler_grader
        from verl.utils.reward_score import geo3k as verl_geo3k
    except ImportError as error:
        why = (f"verl's geo3k scorer is not importable ({error}): pip install -e '.[test]' (mathruler, pylatexenc) "
               "&& pip install --no-deps verl==0.9.1")
        if IN_CI:
            pytest.fail(f"{why}; CI (RLCORE_CI=1) must run the comparison", pytrace=False)
        pytest.skip(why)
    return verl_geo3k, mathruler_grader


@pytest.mark.parametrize("given, truth", ANSWERS)
def test_grading_equals_mathrulers(given, truth):
    _, mathruler_grader = _reference()
    assert grader.grade_answer(given, truth) == mathruler_grader.grade_answer(given, truth)


@pytest.mark.parametrize("given, truth", ANSWERS[::4])
@pytest.mark.parametrize("wrap", ["{}", THINK + "\\boxed{{{}}}", "\\boxed{{{}}} <think>x</think>", THINK + "{}"])
def test_geo3k_equals_verls(given, truth, wrap):
    verl_geo3k, _ = _reference()
    response = wrap.format(given)
    assert geo3k.compute_score(GEO3K, response, truth)["score"] == pytest.approx(verl_geo3k.compute_score(response,
                                                                                                         truth))
