"""The endpoint in front of the real ``hf`` engine (the fsdp actor's own module) on tiny models, driven by
agents written with the ``openai`` package: what each test needs to run a rollout of episodes."""

from __future__ import annotations

import pytest

from tests.fsdp.conftest import backend, one_thread, platform, tiny_model_path  # noqa: F401 - shared fixtures

CALCULATOR_CALL = '{"name": "calculator", "arguments": {"expression": "111*111"}}'
ANSWER = "The answer is #### 12321"
PROMPT_LENGTH, RESPONSE_LENGTH = 1024, 96


class Engine:
    """A tiny model's hf engine on an fsdp actor, and the job around it."""

    def __init__(self, backend, platform, model_path, **agent):
        import attrs

        from rlcore.agents.config import AgentConfig
        from rlcore.plugins.manager import get_manager
        from rlcore.testing import build_actor
        from tests.fsdp.helpers import job

        config = job(model_path, rollout={"temperature": 1.0},
                     sections={"rollout.agent": AgentConfig(**({"name": "test"} | agent))})
        self.config = attrs.evolve(config, data=attrs.evolve(config.data, max_prompt_length=PROMPT_LENGTH,
                                                             max_response_length=RESPONSE_LENGTH))
        self.actor = build_actor(backend, self.config, platform)
        self.rollout = get_manager().get("rollout_engines", "hf")(self.config, platform, self.actor)
        self.engine_calls = 0

    def generate(self, prompts, sampling):
        self.engine_calls += 1
        return self.rollout.generate(prompts, sampling)


def prompt_batch(tokenizer, questions: list[str]):
    """The data loader's prompt rows for ``questions`` (one user message each)."""
    import torch

    from rlcore.batch import Batch

    messages = [[{"role": "user", "content": q}] for q in questions]
    ids = [tokenizer.apply_chat_template(m, tokenize=True, add_generation_prompt=True, return_dict=False)
           for m in messages]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    return Batch({"input_ids": torch.tensor([[pad] * (width - len(i)) + i for i in ids]),
                  "attention_mask": torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])},
                 {"raw_prompt": messages, "ground_truth": ["12321"] * len(questions),
                  "extra_info": [{"index": i} for i in range(len(questions))],
                  "data_source": ["test"] * len(questions)})


def agent_rollout(engine: Engine, run, *, openai_client: bool = True):
    """An ``AgentRollout`` of the job with ``run`` as its agent (closed by the caller)."""
    from rlcore.agents import Agent
    from rlcore.agents.rollout import AgentRollout
    from rlcore.models.loading import load_tokenizer

    tokenizer = load_tokenizer(engine.config.model.path)
    return AgentRollout(engine.config.section("rollout.agent"), Agent(run, openai_client=openai_client), tokenizer,
                        engine.config, echo=print)


@pytest.fixture(scope="session")  # one actor for every test module here
def tiny_engine(backend, platform, tiny_model_path):
    return Engine(backend, platform, tiny_model_path)


@pytest.fixture(scope="session")
def tool_engine(backend, platform, tmp_path_factory):
    from tests.engine_models import build_tool_using_model

    path = build_tool_using_model(tmp_path_factory.mktemp("agents") / "calculator", CALCULATOR_CALL, "12321", ANSWER)
    return Engine(backend, platform, path)
