"""An agent program from outside the core: a calculator agent written with the ``openai`` package only.

It asks the policy with a ``calculator`` tool on offer, runs each call it makes (a small arithmetic
evaluator here, in the agent's own process: the tool is the agent's business, not rlcore's), sends the
results back, and returns the policy's last text as its final answer, which the job's reward function
scores. rlcore records every call's tokens; the agent sees only an OpenAI-compatible server.
"""

import ast
import json
import operator

from rlcore.api import Agent

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression: numbers, + - * / and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
MAX_TURNS = 4

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}


def calculate(arguments: str) -> str:
    """The value of ``{"expression": ...}``, or an error the model reads."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / and parentheses")
    try:
        result = value(ast.parse(json.loads(arguments)["expression"], mode="eval").body)
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


async def calculator_agent(episode, client):
    messages = list(episode.prompt)
    text = ""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = response.choices[0].message
        text = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    return text


CALCULATOR_AGENT = Agent(calculator_agent, description="answers with a calculator tool, through the OpenAI API")
