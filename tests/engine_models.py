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


# GSM8K-like and plain questions for the engines' GPU tests on the real SmolLM2 (tests/*/test_on_gpu.py)
SMOLLM2_QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?",
    "What is 17 + 25?", "Name three primary colors.", "Write a haiku about autumn.",
    "Betty has 5 apples and buys 7 more. How many apples does she have?"]


def smollm2_prompts(model: str):
    """``SMOLLM2_QUESTIONS`` through the model's chat template, left-padded, as a prompt ``Batch``."""
    from rlcore.batch import Batch
    from rlcore.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in SMOLLM2_QUESTIONS]
    tokenizer.padding_side = "left"
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
