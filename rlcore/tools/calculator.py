"""The ``calculator`` tool: arithmetic on numbers, parsed with ``ast`` and evaluated node by node.

Never ``eval``: only number literals, + - * / // % **, unary minus/plus and parentheses are
accepted; anything else (names, calls, attributes) is an error the model reads. Exponents and
intermediate sizes are bounded so ``9**9**9`` cannot take the worker's memory or time.
"""

from __future__ import annotations

import ast
import math
import operator

from rlcore.tools import Tool, ToolResult

MAX_EXPONENT = 1000
MAX_DIGITS = 4000  # integers longer than this are refused (a 10**4000 answer is no arithmetic help)
MAX_LENGTH = 1000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    pass


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic ``expression``; ``CalculatorError`` for anything else."""
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        if isinstance(result, complex):
            raise CalculatorError("the result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_DIGITS * 3.33:
            raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
        return result
    raise CalculatorError(f"unsupported element {type(node).__name__}: only numbers, + - * / // % ** and "
                          "parentheses are allowed")


def _format(value: int | float) -> str:
    if isinstance(value, float) and math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def execute(arguments: dict) -> ToolResult:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return ToolResult("error: the calculator takes {\"expression\": \"<arithmetic>\"}", error=True)
    try:
        return ToolResult(_format(evaluate(expression)))
    except CalculatorError as exc:
        return ToolResult(f"error: {exc}", error=True)


CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    parameters={"type": "object", "properties": {"expression": {
        "type": "string", "description": "e.g. (12 + 30) * 3 / 4"}}, "required": ["expression"]},
    execute=execute,
    timeout_s=5.0,
)
