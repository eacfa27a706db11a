"""``[rollout.multi_turn]``: rollouts that alternate model turns and tool results.

verl's ``actor_rollout_ref.rollout.multi_turn.*`` keys map here (``max_assistant_turns`` is
``max_turns``; ``enable``, ``format``, ``max_parallel_calls``, ``max_tool_response_length`` and
``tool_response_truncate_side`` keep their names); see docs/tools.md.
"""

from __future__ import annotations

import attrs

from rlcore.plugins.settings import Ignore as VerlIgnore
from rlcore.plugins.settings import Refuse as VerlRefuse
from rlcore.plugins.settings import VerlKeys, setting


@attrs.frozen
class MultiTurnConfig:
    enable: bool = setting(False, doc="generate multi-turn conversations with tool calls")
    max_turns: int = setting(5, ge=1, doc="assistant turns per conversation (verl: max_assistant_turns)")
    tools: tuple[str, ...] = setting((), doc="registered tools the model may call (rlcore plugins lists them)")
    format: str = setting("hermes", choices=("hermes",),
                          doc="tool-call format: <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>")
    max_parallel_calls: int = setting(4, ge=1, doc="tool calls executed per assistant turn; more are refused")
    max_tool_response_length: int = setting(256, ge=1, doc="characters of a tool's text shown to the model")
    tool_response_truncate_side: str = setting("middle", choices=("left", "right", "middle"),
                                               doc="which part of a long tool response is dropped")
    stop_at_tool_calls: bool = setting(
        True, doc="end an assistant turn at its tool calls: what the model writes after its first run of "
                  "<tool_call> blocks (a result it imagined, more text) is dropped and never trained on, and the "
                  "turn is closed with the eos token outside the loss; false: a turn must end with eos to be run")
    tool_workers: int = setting(2, ge=1, doc="processes that run tool calls (outside the training processes)")
    tool_rewards: str = setting(
        "add", choices=("add", "report"),
        doc="the reward signals tools return: add = their sum over a conversation's calls is added to its "
            "score; report = only shown (the tool_reward extra and metrics)")
    system_prompt_tools: str = setting(
        "auto", choices=("auto", "always", "never"),
        doc="render the tool schemas into the system prompt (Hermes style): auto = when the chat template "
            "ignores apply_chat_template's tools")


# verl's multi-turn keys: max_assistant_turns is max_turns (the other multi_turn.* keep their names);
# tools come from plugins, not config files
VERL_KEYS = VerlKeys(aliases=(
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "rollout.multi_turn.max_turns"),
), rules=(
    (("actor_rollout_ref.rollout.multi_turn.tool_config_path", "actor_rollout_ref.rollout.multi_turn.function_tool_path",
      "data.function_tool_path", "data.tool_config_path"),
     VerlRefuse("name registered tools in rollout.multi_turn.tools (a plugin registers a tool through "
                "rlcore_register_tools; docs/tools.md)", (None,))),
    (("actor_rollout_ref.rollout.multi_turn.max_user_turns", "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts"),
     VerlRefuse("simulated user turns and repeated rollouts are not implemented in rlcore yet", (None,))),
    (("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",),
     VerlRefuse("rlcore renders every turn with the tokenizer's own chat template", (False,))),
    (("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode",),
     VerlIgnore("machinery", "rlcore tokenizes each turn once itself; there is no re-tokenization to check")),
))
