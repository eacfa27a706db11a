"""Shaped models for the benchmarks: a model folder from a named transformers config, random weights
(bf16 safetensors) and SmolLM2's tokenizer, since no model can be downloaded where the benchmarks run.

    python benchmarks/shapes.py qwen2.5-0.5b --out DIR     # on the GPU machine: built on cuda, seconds
    python benchmarks/shapes.py qwen2.5-vl-3b --out DIR    # a vision-language shape (Qwen2.5-VL's)
    python benchmarks/shapes.py --list                     # the shapes and their parameter counts

A shape is Qwen2.5's architecture (hidden size, layers, heads, KV heads, MLP width, tied embeddings,
q/k/v biases, rope theta 1e6) with SmolLM2's vocabulary (49,152 tokens, so a little smaller than the
real model: qwen2.5-1.5b has 1.39 B parameters, not 1.54 B). The tokenizer and its chat template are
the embedded SmolLM2-135M-Instruct's (``rlcore.models.loading.resolve_model_path``). Random weights make every
sampled response run to its length limit: the shapes measure speed, never learning.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# name -> (hidden, layers, attention heads, KV heads, MLP width, tied embeddings): Qwen2.5's own configs
SHAPES = {
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, True),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, False),
}
# vision-language shapes: name -> (family, language model, vision tower), Qwen2.5-VL-3B-Instruct's config
VISION_SHAPES = {
    "qwen2.5-vl-3b": ("qwen2_5_vl",
                      {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                       "num_attention_heads": 16, "num_key_value_heads": 2, "max_position_embeddings": 128000,
                       "mrope_section": [16, 24, 24]},
                      {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                       "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}),
    # the same layout at toy size: a sitting's commands tried on the CPU first
    "tiny-qwen2.5-vl": ("qwen2_5_vl",
                        {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                         "mrope_section": [6, 5, 5]},
                        {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                         "window_size": 112, "fullatt_block_indexes": [1]}),
}
SMOLLM2_VOCAB = 49152  # len(tokenizer) of SmolLM2-135M-Instruct
SMOLLM2_BOS, SMOLLM2_EOS = 1, 2  # <|im_start|>, <|im_end|>


def shape_config(name: str, vocab_size: int = SMOLLM2_VOCAB, bos: int = SMOLLM2_BOS, eos: int = SMOLLM2_EOS):
    """The transformers ``Qwen2Config`` of shape ``name`` with the given vocabulary."""
    from transformers import Qwen2Config

    if name not in SHAPES:
        raise SystemExit(f"unknown shape {name!r}; shapes: {', '.join([*SHAPES, *VISION_SHAPES])}")
    hidden, layers, heads, kv_heads, intermediate, tied = SHAPES[name]
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=intermediate, tie_word_embeddings=tied,
        max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6, hidden_act="silu",
        use_sliding_window=False, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
        dtype="bfloat16",
    )


def parameter_count(name: str, vocab_size: int = SMOLLM2_VOCAB) -> int:
    """The parameters of shape ``name`` by formula (embeddings, q/k/v with biases, o, SwiGLU MLP, two
    RMSNorms a layer, the final norm, an untied head where there is one)."""
    hidden, layers, heads, kv_heads, intermediate, tied = SHAPES[name]
    kv = hidden // heads * kv_heads
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden
    layer = attention + 3 * hidden * intermediate + 2 * hidden
    return vocab_size * hidden * (1 if tied else 2) + layers * layer + hidden


def fill_zero_embedding_rows(model, seed: int = 0) -> list[int]:
    """Give every all-zero row of the input (and an untied output) embedding random values like the
    others (normal, the config's ``initializer_range``); the rows' token ids.

    transformers zeroes the ``pad_token_id`` row when it initialises a model (``padding_idx``), and these
    shapes take SmolLM2's ``<|im_end|>`` as pad: a token every chat prompt holds, which a trained
    checkpoint never leaves at zero. With that row zero, the PPO line's gradients grew about 300-fold a
    layer in backward and overflowed (docs/benchmarks.md, 2026-12-04): a benchmark artefact, not what a
    real model does."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    std = getattr(model.config, "initializer_range", 0.02)
    filled: set[int] = set()
    for embedding in {id(e): e for e in (model.get_input_embeddings(), model.get_output_embeddings())
                      if e is not None}.values():
        weight = embedding.weight
        zero = (weight == 0).all(dim=-1).nonzero().flatten().tolist()
        with torch.no_grad():
            for row in zero:
                values = torch.randn(weight.shape[-1], generator=generator) * std
                weight[row] = values.to(device=weight.device, dtype=weight.dtype)
        filled.update(zero)
    return sorted(filled)


def build(name: str, out: Path, device: str | None = None, seed: int = 0, tokenizer_from: str | None = None) -> Path:
    """Write shape ``name`` to ``out``: config, random bf16 weights (safetensors), and the tokenizer of
    ``tokenizer_from`` (default: the embedded SmolLM2's), whose vocabulary the model takes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.models.loading import resolve_model_path

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tokenizer_from or "embedded:smollm2-135m-instruct"))
    eos = tokenizer.eos_token_id  # SmolLM2's <|im_end|>
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    config = shape_config(name, vocab_size=len(tokenizer), bos=bos, eos=eos)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    filled = fill_zero_embedding_rows(model, seed)
    model.generation_config.pad_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = bos
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params / 1e9:.3f} B parameters, written to {out} on {device} "
          f"in {time.perf_counter() - start:.1f} s; all-zero embedding rows given random values: {filled}",
          flush=True)
    return out


def build_vision(name: str, out: Path, device: str | None = None, seed: int = 0) -> Path:
    """Write vision-language shape ``name`` to ``out``: random bf16 weights, SmolLM2's tokenizer with the vision
    tokens, the family's image processor (``rlcore.testing.build_vision_model``)."""
    import torch

    from rlcore.testing import build_vision_model

    start = time.perf_counter()
    family, text, vision = VISION_SHAPES[name]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    build_vision_model(out, family=family, text=text, vision=vision, seed=seed, dtype=torch.bfloat16, device=device)
    # transformers zeroes the pad token's embedding row (SmolLM2's <|im_end|>, in every chat prompt): give it
    # values as the text shapes do (fill_zero_embedding_rows), or the first update's gradients overflow
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.bfloat16, device_map=device)
    filled = fill_zero_embedding_rows(model, seed)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params / 1e9:.3f} B parameters, written to {out} on {device} in "
          f"{time.perf_counter() - start:.1f} s; all-zero embedding rows given random values: {filled}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="?", choices=sorted([*SHAPES, *VISION_SHAPES]))
    parser.add_argument("--out", type=Path, help="the model folder to write")
    parser.add_argument("--device", help="where to initialise the weights (default: cuda if there is one)")
    parser.add_argument("--tokenizer", help="a model folder whose tokenizer to take (default: the embedded SmolLM2)")
    parser.add_argument("--list", action="store_true", help="print the shapes and their parameter counts")
    args = parser.parse_args(argv)
    if args.list or args.shape is None:
        for name in SHAPES:
            print(f"{name}: {parameter_count(name) / 1e9:.3f} B parameters")
        return 0
    if args.out is None:
        parser.error("--out DIR is needed to build a shape")
    if (args.out / "config.json").is_file():
        print(f"{args.shape}: {args.out} already holds a model; kept")
        return 0
    if args.shape in VISION_SHAPES:
        build_vision(args.shape, args.out, args.device)
    else:
        build(args.shape, args.out, args.device, tokenizer_from=args.tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
