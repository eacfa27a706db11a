"""``[rollout.agent]``: episodes driven by an agent program through the job's OpenAI-compatible endpoint
(docs/agents.md): a registered agent (``name``) or an external program started per episode
(``command``). The endpoint serves on ``host``:``port`` while the job runs."""

from __future__ import annotations

import shlex

import attrs

from rlcore.errors import did_you_mean
from rlcore.plugins.settings import setting


@attrs.frozen
class AgentConfig:
    name: str | None = setting(None, doc="registered agent that drives each episode (`rlcore plugins` lists "
                                         "them); None: no agents, the engine answers the prompts itself "
                                         "(set name or command, not both)")
    command: str | tuple[str, ...] | None = setting(
        None, doc="an external agent program run once per episode, as its argv (a string is split as a shell "
                  "would); it reads OPENAI_BASE_URL, OPENAI_API_KEY and the episode's JSON (RLCORE_EPISODE), may "
                  "write its answer or reward to RLCORE_RESULT, and its episode ends when it exits")
    host: str = setting("127.0.0.1", doc="address the OpenAI-compatible endpoint listens on")
    port: int = setting(0, ge=0, le=65535, doc="its port; 0: a free port, chosen at the start")
    max_calls: int = setting(32, ge=1, doc="model calls per episode; a call past it is refused (an OpenAI-style "
                                           "error), and the agent should answer")
    timeout_s: float = setting(600.0, gt=0.0, doc="wall-clock seconds per episode; an agent still running then is "
                                                  "cancelled (a program's process group gets SIGTERM, then "
                                                  "SIGKILL), its episode scores 0 (agent/timeouts)")
    batch_wait_s: float = setting(0.05, ge=0.0, doc="how long a call waits for other episodes' calls to join it in "
                                                    "one engine call, unless every running episode is already waiting")
    max_tokens: int | None = setting(None, ge=1, doc="tokens the model may generate per episode, over all its "
                                                     "calls; a call past it is refused (an OpenAI-style error), a "
                                                     "call near it is cut to what is left; None: no limit but "
                                                     "data.max_response_length per row")
    max_failed_share: float = setting(0.5, ge=0.0, le=1.0,
                                      doc="the job stops when more than this share of a rollout's episodes fail "
                                          "(the agent raises, times out, or its process exits non-zero); 1: never")
    record_dir: str | None = setting(None, doc="write each rollout's episodes (every call's prompt and output ids "
                                               "and log-probs, each training row's tokens, mask and log-probs) as "
                                               "<record_dir>/<step>.jsonl (validation: val_<step>.jsonl)")

    @property
    def enabled(self) -> bool:
        return self.name is not None or self.command is not None

    @property
    def key(self) -> str:
        """The key that turns agents on, for messages: ``rollout.agent.name`` or ``rollout.agent.command``."""
        return "rollout.agent.name" if self.name is not None else "rollout.agent.command"

    @property
    def argv(self) -> list[str]:
        """``command`` as the program's argv."""
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command or ())


SECTION = "rollout.agent"


def agent_section(config) -> AgentConfig | None:
    """The job's ``[rollout.agent]`` table, or None when no agent drives its episodes."""
    if SECTION not in config.sections:  # a manager without the core's plugins (some tests)
        return None
    section = config.section(SECTION)
    return section if section.enabled else None


def problems(job) -> list[str]:
    """The agent is registered, and the job's rollout has nothing the agent rollout lacks; registered
    by ``rlcore.agents.plugin``."""
    config = job.config
    section = agent_section(config)
    if section is None:
        return []
    errors = []
    registry = job.manager.registry("agents")
    if section.name is not None and section.command is not None:
        errors.append("rollout.agent.name and rollout.agent.command are both set: an episode is driven by a "
                      "registered agent (name) or by an external program (command); set one of them")
    elif section.command is not None and not section.argv:
        given = section.command if isinstance(section.command, str) else list(section.command)
        errors.append(f"rollout.agent.command = {given!r}: expected a program and its arguments, "
                      "e.g. [\"python\", \"agent.py\"]")
    elif section.name is not None and section.name not in registry:
        errors.append(f"rollout.agent.name = {section.name!r} is no registered agent{did_you_mean(section.name, registry)}; "
                      f"registered: {', '.join(registry.names()) or '(none installed)'}")
    if "rollout.multi_turn" in config.sections and config.section("rollout.multi_turn").enable:
        errors.append(f"{section.key} and rollout.multi_turn.enable both drive the rollout's turns: an agent "
                      "runs its own loop (and its own tools); turn one of them off")
    if config.algorithm.filter_groups.enable:
        errors.append(f"algorithm.filter_groups.enable (dynamic sampling) with {section.key}: agent rollouts "
                      "do not repeat generation yet; turn one of them off")
    if config.rollout.return_routed_experts:
        errors.append("rollout.return_routed_experts: agent episodes do not assemble the engine's routed experts "
                      "across calls yet; turn one of them off")
    return errors
