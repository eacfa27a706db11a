"""The built-in rule scorers, case by case."""

from __future__ import annotations

import pytest

from rlcore.rewards import arithmetic, gsm8k, math

GSM8K = "openai/gsm8k"


@pytest.mark.parametrize("response, truth, expected", [
    ("She makes 9 * 2 = 18.\n#### 18", "18", 1.0),
    ("#### 1,800", "1800", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 17\nwait, #### 18", "18", 1.0),  # the last marked answer counts
    ("#### 18\nno, #### 17", "18", "format"),
    ("#### 17", "18", "format"),
    ("#### 18.", "18", "format"),  # verl compares strings: "18." is not "18"
    ("The answer is 18.", "18", 0.0),  # no "#### " at all
    ("####18", "18", 0.0),  # verl's strict rule needs the space
    ("#### 18" + " padding" * 50, "18", 0.0),  # only the last 300 characters are searched
    ("#### 18", 18, 1.0),  # a numeric ground truth compares as text
])
@pytest.mark.parametrize("format_score", [0.0, 0.1])
def test_gsm8k_is_verls_strict_rule(response, truth, expected, format_score):
    want = format_score if expected == "format" else expected
    result = gsm8k.compute_score(GSM8K, response, truth, None, format_score=format_score)
    assert result == {"score": want, "acc": float(expected == 1.0), "format": float(expected != 0.0),
                      "pred": gsm8k.extract_solution(response)}
    assert (result["pred"] is None) == (expected == 0.0 and "#### " not in response[-300:])


def test_gsm8k_flexible_takes_the_last_number():
    assert gsm8k.extract_solution("so 3 + 4 = 7.", method="flexible") == "7."
    assert gsm8k.compute_score(GSM8K, "it is 18", "18", method="flexible")["score"] == 1.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("1", method="loose")


@pytest.mark.parametrize("response, score, acc, formatted", [
    ("3 + 4 = 7\n#### 7", 1.0, 1.0, 1.0),
    ("#### **7**", 1.0, 1.0, 1.0),
    ("#### $7", 1.0, 1.0, 1.0),
    ("3 + 4 is 7.", 0.8, 1.0, 0.0),  # right, anywhere: paid without the form
    ("The sum is 7, since 3 + 4 = 7.0", 0.8, 1.0, 0.0),
    ("7 is it, because 3 + 4", 0.0, 0.0, 0.0),  # the last number is the answer
    ("#### 8", 0.0, 0.0, 1.0),
    ("#### 7 ... no, 8", 1.0, 1.0, 1.0),  # a marked answer wins over later numbers
    ("I do not know", 0.0, 0.0, 0.0),
    ("", 0.0, 0.0, 0.0),
])
def test_arithmetic_pays_the_right_final_number(response, score, acc, formatted):
    result = arithmetic.compute_score("rlcore/arithmetic", response, "7")
    assert {k: result[k] for k in ("score", "acc", "format")} == {"score": score, "acc": acc, "format": formatted}
    assert (result["pred"] is None) == (response in ("I do not know", ""))


def test_arithmetic_pred_is_the_answer_found_for_majority_voting():
    assert arithmetic.compute_score("", "so 1,234", "1234")["pred"] == "1234"
    assert arithmetic.compute_score("", "#### 7 ... no, 8", "7")["pred"] == "7"


def test_arithmetic_grading_options():
    assert arithmetic.compute_score("", "so 7", "7", {"unformatted_score": 1.0})["score"] == 1.0
    assert arithmetic.compute_score("", "so 7", "7", {"unformatted_score": 0.0})["score"] == 0.0
    assert arithmetic.compute_score("", "so 7", "7", {"unformatted_score": None})["score"] == 0.8
    assert arithmetic.compute_score("", "#### 8", "7", format_score=0.1)["score"] == 0.1
    assert arithmetic.compute_score("", "-12 is the answer: 3 - 15 = -12", "-12")["acc"] == 1.0
    assert arithmetic.compute_score("", "1,024", "1024")["acc"] == 1.0


@pytest.mark.parametrize("response, truth, expected", [
    (r"so $\boxed{\frac{1}{2}}$", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})", 1.0),  # nested braces
    (r"first \boxed{2}, finally \boxed{3}", "3", 1.0),
    (r"\boxed{0.50}", "0.5", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{10\%}", "10", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{\text{(B)}}", "(B)", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\fbox{4}", "4", 1.0),
    (r"the answer is $\boxed 7$", "7", 1.0),
    (r"\boxed{3}", r"The answer is $\boxed{3}$.", 1.0),  # a ground truth given as a solution
    (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
    (r"\boxed{3", "3", 0.0),  # never closed
    ("3", "3", 0.0),  # nothing boxed
])
def test_math_compares_the_last_boxed_answer(response, truth, expected):
    assert math.compute_score("HuggingFaceH4/MATH-500", response, truth) == expected


def test_last_boxed_keeps_nested_braces():
    assert math.last_boxed(r"a \boxed{\sqrt{\frac{a}{b}}} b") == r"\sqrt{\frac{a}{b}}"
    assert math.last_boxed("none") is None


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


@pytest.mark.parametrize("response,score,acc,called", [
    (f"{CALL} so #### 42", 1.1, 1.0, 1.0),  # right answer and a well-formed call
    (f"{CALL}{CALL} #### 41", 0.15, 0.0, 1.0),  # wrong answer (format_score 0.05); two calls earn one bonus
    ("#### 42", 1.0, 1.0, 0.0),  # right without the tool: no bonus
    (f'{CALL} <tool_call>{{"name": </tool_call> #### 42', 1.0, 1.0, 0.0),  # a malformed block: no bonus
    (CALL, 0.1, 0.0, 1.0),
    (CALL.replace("calculator", "add") + " #### 42", 1.0, 1.0, 0.0),  # a tool the row does not offer
])
def test_gsm8k_tools_pays_a_bonus_for_well_formed_calls(response, score, acc, called):
    from rlcore.rewards import gsm8k_tools

    result = gsm8k_tools.compute_score("rlcore/gsm8k_tools", response, "42", {"tool": "calculator"},
                                       format_score=0.05)
    assert result["score"] == pytest.approx(score) and result["acc"] == acc and result["tool_call"] == called
