"""What the megatron tests share: the library they need, the device they need, the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest


def needs_megatron():
    """megatron.core, or skip: it needs Python >= 3.12 and a GPU build environment."""
    return pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install rlcore[megatron], "
                                                       "Python >= 3.12)")


def needs_accelerator(count: int = 1):
    """The current platform, or skip: megatron-core's forward hard-codes CUDA (RNG tracker, RoPE
    device, memory buffer), so the backend runs on accelerators only."""
    from rlcore.runtime.platforms import current_platform

    platform = current_platform()
    if platform.device_type == "cpu":
        pytest.skip("the megatron backend runs on GPUs only (megatron-core's forward hard-codes CUDA)")
    if platform.device_count() < count:
        pytest.skip(f"needs {count} devices, this machine has {platform.device_count()}")
    return platform


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("megatron-models") / "tiny-qwen2")


def build_tiny_qwen3_moe(directory: Path, *, experts: int | None = 4, seed: int = 0, std: float = 0.05,
                         norm_topk_prob: bool = True, layers: int = 2) -> Path:
    """A random Qwen3-MoE causal LM (``layers`` layers, hidden 64, ``experts`` experts of 32 columns, 2 per
    token, query/key norms) and the tiny tokenizer, as a Hugging Face folder; ``experts=None``: the
    dense Qwen3 of the same shape (an MLP of 96 columns). Every tensor, norms included, is random
    (normal, ``std``), so a conversion that swaps or drops one shows; a larger ``std`` makes the
    router's choices and the log-probs far from uniform, for forward checks."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    from rlcore.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(512)
    common = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None}
    config = Qwen3Config(**common) if experts is None else Qwen3MoeConfig(
        **common, moe_intermediate_size=32, num_experts=experts, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(torch.randn_like(param) * std)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def checkpoint_tensors(folder: Path) -> dict:
    """Every tensor of a Hugging Face folder's safetensors files, by its name there (one per expert)."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


@pytest.fixture(scope="session")
def tiny_moe_path(tmp_path_factory) -> Path:
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("megatron-models") / "tiny-qwen3-moe")
