"""GSM8K for multi-turn jobs with a tool (``rlcore data gsm8k --tools calculator``): verl's GSM8K rule
(``rlcore.rewards.gsm8k``) plus a small bonus for using the tool-call format well.

Score: the GSM8K score (1.0 for the right answer after ``####``, ``format_score`` for a wrong one,
0 without one) plus ``tool_call_bonus`` (0.1) when the model's text holds at least one well-formed
``<tool_call>``, no malformed one, and only calls of the row's tool (``extra_info["tool"]``, which
``rlcore data gsm8k --tools`` writes; any name where the row names none). The bonus is paid once per response, however many calls it
makes, so more calls earn nothing; it gives a small model that has never seen the format a signal
before it answers right. Extras: ``acc``, ``format`` (as GSM8K's) and ``tool_call`` (the bonus was
earned), which validation shows apart.
"""

from __future__ import annotations

from rlcore.rewards import gsm8k
from rlcore.tools.format import parse_tool_calls

DATA_SOURCE = "rlcore/gsm8k_tools"
TOOL_CALL_BONUS = 0.1


def well_formed_call(solution_str: str, tool: str | None = None) -> bool:
    """At least one ``<tool_call>`` that parses, none that does not, and every call of ``tool`` (if given)."""
    parsed = parse_tool_calls(solution_str)
    named = tool is None or all(call.name == tool for call in parsed.calls)
    return bool(parsed.calls) and parsed.malformed == 0 and named


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, format_score: float = 0.0,
                  tool_call_bonus: float = TOOL_CALL_BONUS, **kwargs) -> dict[str, float]:
    result = gsm8k.compute_score(data_source, solution_str, ground_truth, format_score=format_score)
    tool = extra_info.get("tool") if isinstance(extra_info, dict) else None
    called = well_formed_call(solution_str, tool)
    return result | {"score": result["score"] + tool_call_bonus * called, "tool_call": float(called)}
