"""The ``hf`` rollout engine: transformers ``generate`` on the fsdp actor's own module."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch.distributed.tensor import DTensor

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.testing import build_actor
from rlcore.training.roles import Actor, SamplingParams
from rlcore.training.specs import rollout_spec
from tests.fsdp.helpers import job

QUESTIONS = ["What is 3 + 4?", "how many apples did she buy each week", "2 * 5 ="]
GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=10)


@pytest.fixture(scope="module")
def prompts(tiny_model_path) -> Batch:
    """The data loader's prompt rows: left-padded ``input_ids`` and ``attention_mask``."""
    encoded = load_tokenizer(str(tiny_model_path))(QUESTIONS, return_tensors="pt", padding=True)
    assert encoded["attention_mask"][:, 0].min() == 0  # some rows are padded
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def engine_for(actor, config, platform):
    return get_manager().get("rollout_engines", "hf")(rollout_spec(config), platform, actor)


def test_greedy_output_equals_transformers_generate(backend, platform, tiny_model_path, prompts):
    from transformers import AutoModelForCausalLM

    config = job(tiny_model_path)
    out = engine_for(build_actor(backend, config, platform), config, platform).generate(prompts, GREEDY)

    tokenizer = load_tokenizer(str(tiny_model_path))
    device = platform.device()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).to(device)
    expected = plain.generate(input_ids=prompts["input_ids"].to(device),
                              attention_mask=prompts["attention_mask"].to(device),
                              do_sample=False, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id)[:, prompts["input_ids"].shape[1]:].cpu()
    width = expected.shape[1]
    assert torch.equal(out["responses"][:, :width], expected)
    assert torch.all(out["responses"][:, width:] == tokenizer.pad_token_id)


def test_n_samples_per_prompt_come_in_order_with_consistent_tensors(backend, platform, tiny_model_path, prompts):
    config = job(tiny_model_path)
    actor = build_actor(backend, config, platform)
    actor.module.train()
    sampling = SamplingParams(n=3, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=12)
    out = engine_for(actor, config, platform).generate(prompts, sampling)

    rows, prompt_length = 3 * len(QUESTIONS), prompts["input_ids"].shape[1]
    assert out["responses"].shape == out["response_mask"].shape == (rows, 12)
    assert torch.equal(out["prompts"], prompts["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    assert torch.equal(out["attention_mask"][:, :prompt_length], prompts["attention_mask"].repeat_interleave(3, 0))
    assert torch.equal(out["attention_mask"][:, prompt_length:], out["response_mask"])
    valid = out["attention_mask"].bool()
    positions = out["attention_mask"].cumsum(-1) - 1
    assert torch.equal(out["position_ids"][valid], positions[valid])
    assert len({tuple(r.tolist()) for r in out["responses"]}) > len(QUESTIONS)  # samples differ
    # the actor's module is handed back as it was lent: training mode, parameters sharded again
    assert actor.module.training
    assert all(isinstance(p, DTensor) for p in actor.module.parameters())


def test_sampling_settings_reach_generate(backend, platform, tiny_model_path, prompts):
    config = job(tiny_model_path)
    engine = engine_for(build_actor(backend, config, platform), config, platform)
    greedy = engine.generate(prompts, GREEDY)["responses"]
    top_1 = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=10))["responses"]
    assert torch.equal(top_1, greedy)  # top_k = 1 leaves only the argmax
    seeded = [engine.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=10, seed=7))["responses"]
              for _ in range(2)]
    assert torch.equal(*seeded)


def reference_log_probs(model_path, out, device, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """Each response token's log-prob under a plain forward pass over prompt + response, with the
    engine's sampling warpers applied to the logits that predict it."""
    from transformers import AutoModelForCausalLM
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    width = out["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=out["input_ids"].to(device), attention_mask=out["attention_mask"].to(device),
                       position_ids=out["position_ids"].to(device)).logits[:, -width - 1:-1].float()
    rows = []
    for step in range(width):
        scores = logits[:, step]
        for warper in ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \
                ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else []):
            scores = warper(None, scores)
        rows.append(torch.log_softmax(scores, -1).gather(1, out["responses"][:, step:step + 1].to(device)))
    return (torch.cat(rows, 1).cpu() * out["response_mask"]).float()


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9,
                                                                 max_new_tokens=10, seed=3)],
                         ids=["greedy", "sampled"])
def test_rollout_log_probs_are_the_sampled_distributions(backend, platform, tiny_model_path, prompts, sampling):
    """The engine's rollout_log_probs equal a forward pass's log-probs of the same tokens under the
    same temperature, top-k and top-p (greedy: the raw logits), and are 0 after each response's end."""
    config = job(tiny_model_path)
    out = engine_for(build_actor(backend, config, platform), config, platform).generate(prompts, sampling)
    expected = reference_log_probs(tiny_model_path, out, platform.device(), temperature=sampling.temperature or 1.0,
                                   top_k=max(sampling.top_k, 0), top_p=sampling.top_p)
    torch.testing.assert_close(out["rollout_log_probs"], expected, atol=1e-4, rtol=0)
    assert (out["rollout_log_probs"][out["response_mask"] == 0] == 0).all()
    assert (out["rollout_log_probs"][out["response_mask"] == 1] < 0).any()


def test_without_calculate_log_probs_the_engine_records_none(backend, platform, tiny_model_path, prompts):
    config = job(tiny_model_path, rollout={"calculate_log_probs": False})
    out = engine_for(build_actor(backend, config, platform), config, platform).generate(prompts, GREEDY)
    assert "rollout_log_probs" not in out and out["responses"].shape == (len(QUESTIONS), 10)


class ScriptedModel(torch.nn.Module):
    """Stands in for the actor's module: ``generate`` returns fixed continuations."""

    def __init__(self, continuations: torch.Tensor, eos: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.continuations = continuations
        self.generation_config = type("GenerationConfig", (), {"eos_token_id": eos})()
        self.seen = None

    def generate(self, input_ids, attention_mask, generation_config, logits_processor=()):
        self.seen, self.processors = generation_config, list(logits_processor)
        return torch.cat([input_ids, self.continuations], dim=1)


class LendingActor(Actor):
    """Lends a model to the engine and does nothing else an actor does."""

    compute_log_prob = update = weights_for_rollout = save = load = None  # the engine calls none of them

    def __init__(self, model):
        self.model = model

    @contextmanager
    def _lend(self):
        yield self.model

    def generation_module(self):
        return self._lend()


def test_responses_are_padded_and_masked_up_to_the_first_eos(platform, tiny_model_path):
    config = job(tiny_model_path)
    tokenizer = load_tokenizer(str(tiny_model_path))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    # generate stopped after 4 tokens (every row finished); the engine pads to max_new_tokens = 6
    continuations = torch.tensor([[11, 12, eos, pad], [21, eos, pad, pad], [31, 32, 33, eos]])
    model = ScriptedModel(continuations, eos)
    engine = get_manager().get("rollout_engines", "hf")(rollout_spec(config), platform, LendingActor(model))
    prompts = Batch({"prompts": torch.tensor([[pad, 5, 6], [7, 8, 9], [pad, pad, 4]])})  # no mask: left pads
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.8, top_k=-1))

    assert out["responses"].tolist() == [[11, 12, eos, pad, pad, pad], [21, eos, pad, pad, pad, pad],
                                         [31, 32, 33, eos, pad, pad]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]]
    assert out["attention_mask"][:, :3].tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 1]]
    assert out["position_ids"].tolist()[2] == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    # transformers samples; the temperature comes as a warper before the recorder of log-probs
    assert model.seen.do_sample and model.seen.top_k == 0 and model.seen.temperature == 1.0
    assert model.seen.max_new_tokens == 6
    assert [type(p).__name__ for p in model.processors] == ["TemperatureLogitsWarper", "SampledLogProbs"]
    assert model.processors[0].temperature == 0.8


def test_an_actor_that_cannot_lend_its_module_is_refused(platform, tiny_model_path, prompts):
    class Remote(Actor):
        compute_log_prob = update = weights_for_rollout = save = load = None

    config = job(tiny_model_path)
    engine = get_manager().get("rollout_engines", "hf")(rollout_spec(config), platform, Remote())
    with pytest.raises(RlcoreError, match="does not lend it"):
        engine.generate(prompts, GREEDY)


@pytest.mark.parametrize("rollout", [{"quantization": "fp8"}, {"data_parallel_size": 2, "expert_parallel_size": 2}])
def test_inference_engine_layouts_are_refused_naming_the_settings(platform, tiny_model_path, rollout):
    """The hf engine runs the actor's own module: a quantized or data/expert-parallel engine is refused,
    not silently run as the plain module."""
    with pytest.raises(RlcoreError, match=r"rollout\.(quantization = 'fp8'|data_parallel_size = 2, "
                                          r"rollout\.expert_parallel_size = 2): the hf rollout engine"):
        engine_for(None, job(tiny_model_path, rollout=rollout), platform)


def test_generation_runs_on_gathered_parameters_and_leaves_training_untouched(backend, platform, tiny_model_path,
                                                                                  prompts):
    from torch.distributed.fsdp import FSDPModule

    from tests.fsdp.helpers import RESPONSE_LENGTH, full_weights, make_batch

    config = job(tiny_model_path)
    lent, untouched = build_actor(backend, config, platform), build_actor(backend, config, platform)
    with lent.generation_module() as model:
        assert not any(isinstance(p, DTensor) for p in model.parameters())  # gathered once for all steps
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        assert not any(u._forward_pre_hooks or u._forward_hooks for u in units)  # FSDP's hooks set aside
    engine_for(lent, config, platform).generate(prompts, SamplingParams(n=2, max_new_tokens=6))

    batch = make_batch(4)
    for actor in (lent, untouched):
        step = batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": torch.ones(4, RESPONSE_LENGTH)}))
        actor.update(step)
    expected = full_weights(untouched)
    for name, value in full_weights(lent).items():
        assert torch.equal(value, expected[name]), name


@pytest.mark.slow  # compiling on a 2-core CPU takes tens of seconds
def test_generation_leaves_compiled_layers_alone(backend, platform, tiny_model_path, prompts):
    """With actor.use_torch_compile a whole job's hf generation recompiled the decoder layer for each cache
    state and layer index until dynamo's recompile limit (8), after which training ran eager as well
    (2026-12-06): generation now runs the layers eager and compiles nothing, and training still compiles."""
    import torch._dynamo

    torch._dynamo.reset()
    config = job(tiny_model_path, actor={"use_torch_compile": True})
    actor = build_actor(backend, config, platform)
    counters = torch._dynamo.utils.counters  # the process's, since its start: compared before and after
    frames_before = counters["frames"].get("total", 0)
    engine_for(actor, config, platform).generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6))
    assert counters["frames"].get("total", 0) == frames_before  # no frame was even handed to dynamo
    graphs_before = counters["stats"].get("unique_graphs", 0)
    rows = Batch({"input_ids": prompts["input_ids"], "attention_mask": prompts["attention_mask"],
                  "position_ids": (prompts["attention_mask"].cumsum(-1) - 1).clamp(min=0),
                  "responses": prompts["input_ids"][:, -2:],
                  "response_mask": prompts["attention_mask"][:, -2:]})
    actor.compute_log_prob(rows)
    assert counters["stats"].get("unique_graphs", 0) > graphs_before
