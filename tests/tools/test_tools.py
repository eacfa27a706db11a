import json
import os
import time

import pytest

from rlcore.plugins.manager import PluginManager
from rlcore.tools import Tool, ToolResult
from rlcore.tools.calculator import CalculatorError, evaluate
from rlcore.tools.calculator import execute as calculate
from rlcore.tools.runner import ToolCall, ToolRunner


@pytest.mark.parametrize("expression,value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("-4 ** 2", -16), ("7 // 2", 3), ("7 % 4", 3), ("2 ** 10", 1024),
    ("1 / 4", 0.25), ("-(3 - 5)", 2), ("+3", 3), ("1.5 * 2", 3.0),
])
def test_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression,why", [
    ("__import__('os').system('true')", "unsupported"), ("x + 1", "unsupported"), ("'a' * 3", "unsupported"),
    ("9 ** 9 ** 9", "exponent"), ("1 / 0", "division by zero"), ("1 +", "not an arithmetic"),
    ("(10 ** 999) ** 10", "digits"), ("[1, 2]", "unsupported"), ("(-8) ** 0.5", "not a real"),
])
def test_calculator_refuses_everything_else(expression, why):
    with pytest.raises(CalculatorError, match=why):
        evaluate(expression)


def test_calculator_tool_reports_errors_as_text():
    assert calculate({"expression": "6 * 7"}) == ToolResult("42")
    assert calculate({"expression": "open('x')"}).error
    assert calculate({"expr": "1"}).error


def test_builtin_tools_register_through_the_hook():
    manager = PluginManager(autoload=False)
    tools = manager.registry("tools")
    assert {"calculator", "python"} <= set(tools.names())
    core = next(p for p in manager.describe()["plugins"] if p["name"] == "rlcore.tools.plugin")
    assert core["registered"]["tools"] == ["calculator", "python"]
    schema = tools.get("calculator").schema()
    assert schema["function"]["parameters"]["required"] == ["expression"]
    json.dumps(schema)  # plain JSON, as chat templates take it


def slow(arguments):
    time.sleep(arguments["seconds"])
    return ToolResult("done")


def report_pid(arguments):
    return ToolResult(str(os.getpid()))


def explode(arguments):
    if arguments.get("exit"):
        os._exit(9)
    raise ValueError("boom")


def wrong_type(arguments):
    if arguments.get("signal"):
        return ToolResult("x", rewards={"bonus": float("nan")})
    return "plain text"


SLOW = Tool("slow", "sleeps", {"type": "object"}, slow, timeout_s=0.5)
PID = Tool("pid", "its process", {"type": "object"}, report_pid)
EXPLODE = Tool("explode", "fails", {"type": "object"}, explode)
WRONG = Tool("wrong", "returns a str", {"type": "object"}, wrong_type)


def test_runner_runs_tools_outside_this_process_with_timeouts():
    from rlcore.tools.calculator import CALCULATOR

    with ToolRunner({"calculator": CALCULATOR, "slow": SLOW, "pid": PID}, workers=2) as runner:
        outcomes = runner.run([ToolCall("calculator", {"expression": "2 + 2"}), ToolCall("pid", {}),
                               ToolCall("slow", {"seconds": 30}), ToolCall("nope", {})])
        assert outcomes[0].result.text == "4"
        assert int(outcomes[1].result.text) != os.getpid()
        assert outcomes[2].timed_out and outcomes[2].result.error and outcomes[2].seconds < 5
        assert outcomes[3].result.error and "unknown tool 'nope'" in outcomes[3].result.text
        # the stuck worker was replaced: the pool still answers
        assert [o.result.text for o in runner.run([ToolCall("slow", {"seconds": 0})] * 3)] == ["done"] * 3


def test_a_failing_or_dying_tool_is_an_error_the_model_reads():
    with ToolRunner({"explode": EXPLODE, "wrong": WRONG, "pid": PID}, workers=1) as runner:
        raised, died, wrong, nan, after = runner.run([
            ToolCall("explode", {}), ToolCall("explode", {"exit": True}), ToolCall("wrong", {}),
            ToolCall("wrong", {"signal": True}), ToolCall("pid", {})])
        assert raised.result == ToolResult("error: explode raised ValueError: boom", error=True)
        assert died.result == ToolResult("error: explode killed its worker process (exit code 9)", error=True)
        assert wrong.result.error and "returned str, not a ToolResult" in wrong.result.text
        assert nan.result == ToolResult("error: wrong returned reward signal 'bonus' = nan, not a finite number",
                                        error=True)
        assert int(after.result.text) != os.getpid()  # the dead worker was replaced
        assert runner.pool.replaced == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (as in CI)")
def test_python_tool_runs_code_in_the_sandbox():
    from rlcore.tools.python import execute

    assert execute({"code": "print(sum(range(10)))"}).text.strip() == "45"
    failed = execute({"code": "raise ValueError('boom')"})
    assert failed.error and "ValueError: boom" in failed.text
