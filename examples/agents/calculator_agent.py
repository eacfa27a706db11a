"""A calculator agent for GSM8K, written with the ``openai`` package only: an external agent program that
rlcore trains without knowing its code (``rollout.agent.command``, examples/gsm8k_calculator_agent_smollm2.toml).

It asks the model with a ``calculator`` tool on offer (OpenAI's tools schema), evaluates each call
(arithmetic only, parsed with ``ast``: nothing is executed), sends the results back, and loops until the
model answers without a tool call; that text is its final answer, scored by the job's reward function.

rlcore starts it once per episode with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (read by the ``openai``
package itself), ``RLCORE_EPISODE`` (a JSON file: the prompt's chat messages, ground_truth, extra_info,
data_source, sample) and ``RLCORE_RESULT`` (where it writes ``{"answer": ...}``). By hand, against any
OpenAI-compatible server: ``OPENAI_BASE_URL=... OPENAI_API_KEY=... python calculator_agent.py "What is 12 * 3?"``.
"""

import ast
import json
import operator
import os
import sys

import openai

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression: numbers, + - * / // % and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
SYSTEM = ("Solve the problem step by step. For arithmetic, call the calculator tool and read its result. "
          'Then output the final answer after "####".')
MAX_CALLS = 4  # model calls per episode (rollout.agent.max_calls refuses more anyway)

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError for anything else (names, calls, powers)."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / // % and parentheses")
    return value(ast.parse(expression.replace(",", ""), mode="eval").body)


def calculator(arguments: str) -> str:
    """The tool's reply to a call's JSON arguments: the value, or an error the model reads."""
    try:
        result = evaluate(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError, SyntaxError, ZeroDivisionError, json.JSONDecodeError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def solve(client: openai.OpenAI, messages: list[dict]) -> str:
    """Ask, run the calculator calls, ask again; the model's last text."""
    messages = [{"role": "system", "content": SYSTEM}, *messages]
    text = ""
    for _ in range(MAX_CALLS):
        try:
            response = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        except openai.BadRequestError:  # a limit of the episode (calls, tokens, context): answer with what we have
            break
        message = response.choices[0].message
        text = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)})
    return text


def main() -> None:
    client = openai.OpenAI(max_retries=0)  # the base URL and the key come from the environment
    if "RLCORE_EPISODE" not in os.environ:  # by hand: the question on the command line
        print(solve(client, [{"role": "user", "content": " ".join(sys.argv[1:])}]))
        return
    with open(os.environ["RLCORE_EPISODE"], encoding="utf-8") as file:
        episode = json.load(file)
    answer = solve(client, episode["prompt"])
    with open(os.environ["RLCORE_RESULT"], "w", encoding="utf-8") as file:
        json.dump({"answer": answer}, file)


if __name__ == "__main__":
    main()
