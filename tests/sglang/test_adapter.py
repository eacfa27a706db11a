"""The sglang adapter's own logic, with a fake standing in for ``sglang.Engine``: registration, its
config table, the missing-library error, settings and outputs mapping, weight and memory calls."""

from __future__ import annotations

import json
import sys

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config import load_job
from rlcore.errors import ConfigError, RlcoreError
from rlcore.plugins.manager import get_manager
from rlcore.rollout.outputs import ROLLOUT_TIMING
from rlcore.runtime.platforms import CpuPlatform
from rlcore.training.roles import SamplingParams, group_seed
from rlcore.training.specs import rollout_spec
from rlcore_sglang.options import SglangOptions
from rlcore_sglang.rollout import SglangRollout, check_version, completions, engine_arguments, sampling_arguments
from tests.conftest import run_rlcore


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sglang-models") / "tiny-qwen2")


def job_config(*overrides: str, model=None):
    model = [f"model.path={json.dumps(str(model))}"] if model else []
    return load_job(None, ["rollout.name=sglang", *model, *overrides], check=False).config


# SGLang's sampling-parameter names and memory tags, the same in 0.5.12 and 0.5.17
# (sglang/srt/sampling/sampling_params.py, sglang/srt/constants.py): the fake refuses others, as SGLang does.
SAMPLING_KEYS = {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
                 "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
                 "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                 "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval", "logit_bias",
                 "sampling_seed"}
MEMORY_TAGS = {"kv_cache", "weights", "cuda_graph"}


class FakeEngine:
    """Records every call and answers as SGLang 0.5.12-0.5.17 do: each response is the prompt's last
    token + 1, + 2, then eos (id 2), as ``output_ids`` and ``(logprob, id, None)`` log-prob entries; a
    dict for one prompt; ``(True, "Success")`` for a weight update; a resumed tag must be released."""

    def __init__(self, **arguments):
        self.arguments, self.calls, self.released = arguments, [], set()

    def generate(self, input_ids, sampling_params, return_logprob):
        self.calls.append(("generate", sampling_params, return_logprob))
        for params in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
            if unknown := set(params) - SAMPLING_KEYS:
                raise TypeError(f"unexpected sampling parameters {unknown}")
        if isinstance(sampling_params, list) and len(sampling_params) != len(input_ids):
            raise ValueError("one sampling_params per prompt")
        outputs = [{"output_ids": [row[-1] + 1, row[-1] + 2, 2], "meta_info": {"output_token_logprobs": [
            (-0.5, row[-1] + 1, None), (-0.25, row[-1] + 2, None), (-0.125, 2, None)]} if return_logprob else {}}
            for row in input_ids]
        return outputs[0] if len(outputs) == 1 else outputs  # one prompt row: SGLang answers with a dict

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update_weights_from_tensor", [name for name, _ in named_tensors], flush_cache))
        return True, "Success"

    def flush_cache(self):
        self.calls.append(("flush_cache",))

    def release_memory_occupation(self, tags=None):
        assert set(tags) <= MEMORY_TAGS
        self.released |= set(tags)
        self.calls.append(("release_memory_occupation", tags))

    def resume_memory_occupation(self, tags=None):
        for tag in tags:
            self.released.remove(tag)  # SGLang's scheduler: KeyError for a tag that was not released
        self.calls.append(("resume_memory_occupation", tags))


class BucketActor:
    def weights_for_rollout(self, bucket_bytes):
        yield [("a", torch.zeros(1)), ("b", torch.zeros(1))]
        yield [("c", torch.zeros(1))]


SYNC = [("update_weights_from_tensor", ["a", "b"], False), ("update_weights_from_tensor", ["c"], False),
        ("flush_cache",)]


def test_rlcore_plugins_lists_the_engine_and_its_table():
    result = run_rlcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "sglang"]
    assert plugin["registered"] == {"config_sections": ["rollout.sglang"], "rollout_engines": ["sglang"],
                                    "verl_keys": ["sglang"]}


def test_the_table_is_validated():
    config = job_config("rollout.sglang.max_running_requests=8", "rollout.sglang.engine_kwargs={page_size = 16}")
    assert config.section("rollout.sglang") == SglangOptions(max_running_requests=8, engine_kwargs={"page_size": 16})
    with pytest.raises(ConfigError, match='rollout.sglang.disable_cuda_graphs: unknown key'):
        job_config("rollout.sglang.disable_cuda_graphs=true")


def test_a_missing_sglang_is_one_error_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang raises ImportError
    factory = get_manager().get("rollout_engines", "sglang")
    with pytest.raises(RlcoreError, match=r"needs the sglang library.*pip install rlcore\[sglang\]"):
        factory(job_config(), CpuPlatform(), None)


def test_tensor_parallelism_is_refused_with_a_way_out(tiny_model):
    config = job_config("rollout.tensor_model_parallel_size=2", model=tiny_model)
    with pytest.raises(RlcoreError, match="one engine per worker.*every device of a tensor-.*use 1"):
        SglangRollout(rollout_spec(config), CpuPlatform(), None, engine_factory=FakeEngine)


@pytest.mark.parametrize("key", ["data_parallel_size", "expert_parallel_size"])
def test_data_and_expert_parallelism_are_refused_like_tensor_parallelism(tiny_model, key):
    config = job_config(f"actor_rollout_ref.rollout.{key}=2", model=tiny_model)  # unchecked: one key at a time
    with pytest.raises(RlcoreError, match=f"rollout.{key} = 2: the sglang engine runs one engine per worker"):
        SglangRollout(rollout_spec(config), CpuPlatform(), None, engine_factory=FakeEngine)


def test_verls_quantization_key_reaches_the_engine(tiny_model):
    """verl's rollout.quantization is SGLang's quantization server argument, received by the engine."""
    config = job_config("actor_rollout_ref.rollout.quantization=fp8", model=tiny_model)
    rollout = SglangRollout(rollout_spec(config), CpuPlatform(), None, engine_factory=FakeEngine)
    assert rollout.engine.arguments["quantization"] == "fp8"
    assert (rollout.engine.arguments["dp_size"], rollout.engine.arguments["ep_size"]) == (1, 1)
    assert "json_model_override_args" not in rollout.engine.arguments


def test_the_policys_config_override_reaches_the_engine_as_json(tiny_model):
    """model.override_config is SGLang's json_model_override_args: the engine runs the actor's config."""
    config = job_config("actor_rollout_ref.model.override_config.max_position_embeddings=77", model=tiny_model)
    rollout = SglangRollout(rollout_spec(config), CpuPlatform(), None, engine_factory=FakeEngine)
    assert json.loads(rollout.engine.arguments["json_model_override_args"]) == {"max_position_embeddings": 77}


def test_engine_arguments_carry_the_rollout_settings_and_the_table(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    config = job_config("rollout.gpu_memory_utilization=0.4", "data.max_prompt_length=100",
                        "data.max_response_length=28", "trainer.seed=5", "model.dtype=bfloat16",
                        "rollout.sglang.chunked_prefill_size=-1", "rollout.sglang.engine_kwargs={page_size = 16}")
    assert engine_arguments(rollout_spec(config), CpuPlatform(), "/m", "/t") == {
        "model_path": "/m", "tokenizer_path": "/t", "trust_remote_code": False, "dtype": "bfloat16", "tp_size": 1,
        "mem_fraction_static": 0.4, "context_length": 128, "disable_cuda_graph": False, "load_format": "auto",
        "random_seed": 5, "enable_memory_saver": True, "chunked_prefill_size": -1, "page_size": 16,
        "base_gpu_id": 0, "skip_tokenizer_init": True,  # no stop strings: token ids in and out
        "dp_size": 1, "ep_size": 1, "quantization": None,
    }
    with_stops = job_config("rollout.sglang.stop=['\\n\\n']", "rollout.sglang.deterministic_inference=true",
                            "rollout.free_cache_engine=false")
    arguments = engine_arguments(rollout_spec(with_stops), CpuPlatform(), "/m", "/t")
    assert not arguments["skip_tokenizer_init"]  # SGLang matches stop strings on text
    assert arguments["enable_deterministic_inference"] and not arguments["enable_memory_saver"]


def test_sampling_settings_map_onto_sglangs():
    options = SglangOptions()
    greedy = sampling_arguments(SamplingParams(do_sample=False, temperature=0.7, top_k=5, max_new_tokens=9),
                                options, [2])
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"], greedy["max_new_tokens"]) == (0.0, 1.0, -1, 9)
    sampled = sampling_arguments(SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=-1), options, [2, 7])
    assert (sampled["n"], sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (1, 0.7, 0.9, -1)
    assert sampled["stop_token_ids"] == [2, 7] and sampled["stop"] is None and sampled["no_stop_trim"]
    assert sampling_arguments(SamplingParams(top_k=5), attrs.evolve(options, stop=("\n\n",)), [])["stop"] == ["\n\n"]


def test_completions_read_token_ids_and_log_probs():
    outputs = [{"output_ids": [11, 2], "meta_info": {"output_token_logprobs": [(-0.5, 11, "a"), (-0.25, 2, None)]}},
               {"output_ids": [], "meta_info": {"output_token_logprobs": []}}]
    assert completions(outputs, 2) == ([[11, 2], []], [[-0.5, -0.25], []])
    assert completions(outputs[0], 1) == ([[11, 2]], [[-0.5, -0.25]])  # SGLang answers one prompt with a dict
    with pytest.raises(RuntimeError, match="2 outputs for 3 prompt rows"):
        completions(outputs, 3)
    short = {"output_ids": [11, 2, 5], "meta_info": {"output_token_logprobs": [(-0.5, 11, None), (-0.25, 2, None)]}}
    with pytest.raises(RuntimeError, match="output 0: 3 output_ids but log-probs for 2 tokens"):
        completions([short], 1)
    assert completions([{"output_ids": [11, 2], "meta_info": {}}], 1, with_log_probs=False) == ([[11, 2]], None)


def test_generation_takes_the_actors_weights_first_and_returns_n_rows_per_prompt(tiny_model):
    engine = SglangRollout(rollout_spec(job_config(model=tiny_model)), CpuPlatform(), BucketActor(),
                           engine_factory=FakeEngine)
    prompts = Batch({"input_ids": torch.tensor([[0, 5, 6], [7, 8, 9]]), "attention_mask": torch.tensor([[0, 1, 1],
                                                                                                        [1, 1, 1]])})
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=4, seed=3))

    assert engine.engine.calls[:3] == SYNC  # the actor may hold other weights than model.path
    (name, params, return_logprob), = engine.engine.calls[3:]
    # one dict for the batch: SGLang reads per-request seeds only under deterministic inference
    assert name == "generate" and isinstance(params, dict) and "sampling_seed" not in params and return_logprob
    assert params["temperature"] == 0.8 and params["n"] == 1
    assert set(out.meta[ROLLOUT_TIMING]) == {"prepare", "engine", "rows"}
    assert out["responses"].tolist() == [[7, 8, 2, 0], [7, 8, 2, 0], [10, 11, 2, 0], [10, 11, 2, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 0]] * 4
    assert out["rollout_log_probs"][0].tolist() == [-0.5, -0.25, -0.125, 0.0]
    assert torch.equal(out["prompts"], prompts["input_ids"].repeat_interleave(2, dim=0))
    engine.generate(prompts, SamplingParams(max_new_tokens=4))
    assert engine.engine.calls[-1][0] == "generate" and isinstance(engine.engine.calls[-1][1], dict)  # no new sync


def test_without_calculate_log_probs_sglang_is_asked_for_none(tiny_model):
    engine = SglangRollout(rollout_spec(job_config("rollout.calculate_log_probs=false", model=tiny_model)),
                           CpuPlatform(), BucketActor(), engine_factory=FakeEngine)
    prompts = Batch({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.tensor([[1, 1]])})
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4))
    assert engine.engine.calls[-1][0] == "generate" and engine.engine.calls[-1][2] is False
    assert "rollout_log_probs" not in out.tensors
    assert out["responses"].tolist() == [[7, 8, 2, 0]] * 2 and out["response_mask"].tolist() == [[1, 1, 1, 0]] * 2


def test_memory_is_released_while_training_and_refilled_with_the_latest_weights(tiny_model):
    engine = SglangRollout(rollout_spec(job_config(model=tiny_model)), CpuPlatform(), BucketActor(),
                           engine_factory=FakeEngine)
    assert engine.engine.arguments["enable_memory_saver"]
    calls = engine.engine.calls
    prompts = Batch({"prompts": torch.tensor([[5, 6]])})

    engine.resume_memory()  # as the hybrid worker calls it: resume, generate, release
    engine.generate(prompts, SamplingParams(max_new_tokens=4))
    engine.release_memory()
    assert calls[-1] == ("release_memory_occupation", ["kv_cache", "weights"])

    calls.clear()  # an actor update, then the weight sync, then the next generation
    engine.update_weights(BucketActor().weights_for_rollout(0))
    engine.resume_memory()
    engine.generate(prompts, SamplingParams(max_new_tokens=4))
    assert [c[0] for c in calls] == ["resume_memory_occupation", "update_weights_from_tensor",
                                     "update_weights_from_tensor", "flush_cache", "resume_memory_occupation",
                                     "generate"]
    assert calls[0] == ("resume_memory_occupation", ["weights"]) and calls[4] == ("resume_memory_occupation",
                                                                                 ["kv_cache"])

    engine.release_memory()  # no update before the next generation (validation, critic warm-up):
    calls.clear()  # released weights are gone, so the actor's are loaded again
    engine.resume_memory()
    assert calls == [("resume_memory_occupation", ["weights"]), *SYNC, ("resume_memory_occupation", ["kv_cache"])]


def test_without_free_cache_engine_memory_stays(tiny_model):
    engine = SglangRollout(rollout_spec(job_config("rollout.free_cache_engine=false", model=tiny_model)),
                           CpuPlatform(), None, engine_factory=FakeEngine)
    engine.release_memory()
    engine.resume_memory()
    engine.generate(Batch({"prompts": torch.tensor([[5, 6]])}), SamplingParams(max_new_tokens=4))
    assert [c[0] for c in engine.engine.calls] == ["generate"]  # no actor: model.path's weights are the truth
    assert not engine.engine.arguments["enable_memory_saver"]


def test_seeds_go_row_by_row_only_where_sglang_reads_them(tiny_model):
    config = job_config("rollout.sglang.deterministic_inference=true", model=tiny_model)
    engine = SglangRollout(rollout_spec(config), CpuPlatform(), None, engine_factory=FakeEngine)
    prompts = Batch({"prompts": torch.tensor([[5, 6], [7, 8]])})
    engine.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=4, seed=3))
    params = engine.engine.calls[-1][1]
    assert [p["sampling_seed"] for p in params] == [group_seed(3, 0) + i for i in range(4)]
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0.8, max_new_tokens=4))
    assert isinstance(engine.engine.calls[-1][1], dict)  # unseeded call: one dict
    assert set(out.meta[ROLLOUT_TIMING]) == {"engine", "rows"}  # nothing to prepare: no actor


def test_one_prompt_row_comes_back_as_sglangs_single_dict(tiny_model):
    engine = SglangRollout(rollout_spec(job_config(model=tiny_model)), CpuPlatform(), None, engine_factory=FakeEngine)
    out = engine.generate(Batch({"prompts": torch.tensor([[5, 6]])}), SamplingParams(max_new_tokens=3))
    assert out["responses"].tolist() == [[7, 8, 2]] and out["rollout_log_probs"][0].tolist() == [-0.5, -0.25, -0.125]


def test_a_failed_weight_update_is_raised_with_sglangs_message(tiny_model):
    class Refusing(FakeEngine):
        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            return False, "Failed to update parameter online: shape mismatch"

    engine = SglangRollout(rollout_spec(job_config(model=tiny_model)), CpuPlatform(), BucketActor(),
                           engine_factory=Refusing)
    with pytest.raises(RuntimeError, match="update_weights_from_tensor failed: .*shape mismatch"):
        engine.generate(Batch({"prompts": torch.tensor([[5, 6]])}), SamplingParams(max_new_tokens=3))


def test_an_old_sglang_is_refused_naming_its_version():
    for supported in ("0.5.12", "0.5.17", "0.5.17rc1", "0.5.23+cu130", "0.6.0"):
        check_version(supported)
    for old in ("0.5.11", "0.5.9.post2", "0.4.10"):
        with pytest.raises(RlcoreError, match=rf"needs sglang 0.5.12 or newer; this environment has sglang {old}\."):
            check_version(old)


def test_a_too_old_sglang_is_refused_when_the_engine_starts(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(__version__="0.5.9", Engine=FakeEngine))
    factory = get_manager().get("rollout_engines", "sglang")
    with pytest.raises(RlcoreError, match=r"needs sglang 0.5.12 or newer.*has sglang 0.5.9.*rlcore\[sglang\]"):
        factory(job_config(), CpuPlatform(), None)
