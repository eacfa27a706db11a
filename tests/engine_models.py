"""The tiny model the engine tests (vllm, sglang) generate with."""

from __future__ import annotations

from pathlib import Path


def build_engine_model(directory: Path) -> Path:
    """A tiny Qwen2 that vLLM's CPU attention accepts (head size 32: it refuses 16), its weights drawn
    wide enough (std 0.3) that greedy decoding varies and the top two logits stay well apart."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_model

    path = build_tiny_model(directory, hidden_size=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path
