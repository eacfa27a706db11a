"""Agent programs trained through an OpenAI-compatible endpoint in front of the job's rollout engine.

A registered ``Agent`` (``rlcore_register_agents``) is an async function that drives one episode: it
receives the ``Episode`` (the dataset's prompt, ground truth and extra info, and the endpoint's
``base_url`` and ``api_key`` that name this episode) and, where ``openai_client`` is true, an
``openai.AsyncOpenAI`` bound to them. It calls the model as it would call any OpenAI-style server and
returns its final answer (a ``str``, scored by the job's reward function), a reward (a number), or
``None`` (the last call's text is scored). The endpoint (``rlcore.agents.server``) records the exact
token ids and log-probs of every call; ``rlcore.agents.transcript`` turns an episode's calls into
training rows. docs/agents.md tells the whole story.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs


@attrs.frozen
class Episode:
    """One episode as the agent sees it: a dataset row and the endpoint's address for this episode."""

    prompt: list[dict]  # the dataset's chat messages (verl's ``prompt`` column)
    ground_truth: Any
    extra_info: dict
    data_source: str
    base_url: str  # http://host:port/v1
    api_key: str  # names this episode: every request made with it belongs to it
    sample: int = 0  # which of the prompt's rollout.n episodes this is


# An agent's return: a final answer scored by the job's reward function, a reward, or None (the text of
# the episode's last call is scored).
AgentResult = str | float | int | None


@attrs.frozen
class Agent:
    """What a plugin registers under ``rlcore_register_agents``: ``run(episode, client)``, an async
    function; ``client`` is an ``openai.AsyncOpenAI`` bound to the episode (``openai_client = True``,
    the ``openai`` package must be installed: ``pip install rlcore[agents]``), else ``None`` and the
    agent talks to ``episode.base_url`` with ``episode.api_key`` itself."""

    run: Callable[[Episode, Any], Awaitable[AgentResult]]
    openai_client: bool = True
    description: str = ""
