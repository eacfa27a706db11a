"""An agent program from outside the core: a calculator agent written with the ``openai`` package.

It asks the policy with a ``calculator`` tool on offer, runs each call it makes in the agent's own
process (with rlcore's built-in calculator, which evaluates arithmetic without ``eval``: the tool is the
agent's business, not the rollout's), sends the results back, and returns the policy's last text as its
final answer, which the job's reward function scores. rlcore records every call's tokens; the agent sees
only an OpenAI-compatible server.
"""

import json

from rlcore.api import CALCULATOR, Agent

CALCULATOR_SCHEMA = {"type": "function", "function": {
    "name": CALCULATOR.name, "description": CALCULATOR.description, "parameters": CALCULATOR.parameters}}
MAX_TURNS = 4


def calculate(arguments: str) -> str:
    """The value of ``{"expression": ...}``, or an error the model reads."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"error: the arguments are not JSON ({exc})"
    return CALCULATOR.execute(parsed if isinstance(parsed, dict) else {}).text


async def calculator_agent(episode, client):
    messages = list(episode.prompt)
    text = ""
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR_SCHEMA])
        message = response.choices[0].message
        text = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    return text


CALCULATOR_AGENT = Agent(calculator_agent, description="answers with a calculator tool, through the OpenAI API")
