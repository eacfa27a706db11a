"""Training throughput of the fsdp actor: padded micro-batches against packed rows with dynamic
batch size, on a Qwen2.5-0.5B-shaped model (random weights) and a GSM8K-like mix of lengths.

Run (the GPU machine; one process per GPU)::

    python benchmarks/fsdp_throughput.py --out bench.json                              # 1 GPU
    torchrun --nproc_per_node 2 benchmarks/fsdp_throughput.py --out bench.json          # 2 GPUs
    python benchmarks/fsdp_throughput.py --tiny --samples 16 --steps 1                 # smoke test, CPU
    torchrun --nproc_per_node 2 benchmarks/fsdp_throughput.py --modes packed+dynamic --ulysses 2   # Ulysses SP 2
    python benchmarks/fsdp_throughput.py --compile --out bench.json                    # torch.compile'd layers

What one measurement is: ``actor.update`` on a batch of ``--samples`` samples (all ranks together,
one optimizer step: ``ppo_mini_batch_size`` = the whole batch), prompts of 100-250 tokens
(left-padded to 256), responses of 30-512 tokens (right-padded to 512), uniform, seed 0; bf16
compute with fp32 master weights and AdamW, gradient checkpointing on; the same update as rlcore
trains with (policy loss, entropy metric). One warm-up update, then ``--steps`` timed ones.

- padded: rows as the rollout hands them over (768 tokens each), ``ppo_micro_batch_size_per_gpu`` 16;
- packed+dynamic: ``model.use_remove_padding`` and ``actor.use_dynamic_bsz`` with
  ``ppo_max_token_len_per_gpu`` = 16 x 768 = 12288, the padded micro-batch's footprint.

``--ulysses N`` splits each packed micro-batch over groups of N ranks (``actor.ulysses_sequence_parallel_size``;
the token budget stays per rank, so a group's micro-batch holds N times as many tokens); ``--compile``
compiles the decoder layers (``actor.use_torch_compile``; the warm-up update pays the compile).

tokens/s counts real (non-pad) prompt and response tokens only, over all GPUs. MFU counts the
model FLOPs of those real tokens, 6 x (decoder parameters x tokens + lm_head x response tokens
(only response positions get logits)) + 6 x layers x hidden x sum(length^2) (causal attention,
forward and backward), against 989 TFLOP/s of dense bf16 per H200; gradient-checkpointing
recompute is not counted. Peak memory is the device allocator's peak on rank 0 for that mode.
Old log-probs (``compute_log_prob``, forward only) are timed too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

PEAK_FLOPS = {"cuda": 989e12}  # dense bf16, H100/H200 SXM
PROMPT_WIDTH, RESPONSE_WIDTH = 256, 512
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def build_model(shape: dict, folder: Path) -> Path:
    """A random Qwen2 of ``shape`` saved as a Hugging Face folder (rank 0 writes, the others wait)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if rank() == 0 and not (folder / "config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=torch.bfloat16)
        model.save_pretrained(folder)
    if dist.is_initialized():
        dist.barrier()
    return folder


def gsm8k_like_batch(samples: int, vocab: int, seed: int = 0):
    """Rows as the rollout makes them: prompts 100-250 tokens left-padded to 256, responses
    30-512 tokens right-padded to 512."""
    from rlcore.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(100, 251, (samples,), generator=g)
    response_lengths = torch.randint(30, 513, (samples,), generator=g)
    cols_p, cols_r = torch.arange(PROMPT_WIDTH), torch.arange(RESPONSE_WIDTH)
    prompt_mask = (cols_p[None, :] >= PROMPT_WIDTH - prompt_lengths[:, None]).long()
    response_mask = (cols_r[None, :] < response_lengths[:, None]).long()
    prompts = torch.randint(3, vocab, (samples, PROMPT_WIDTH), generator=g) * prompt_mask
    responses = torch.randint(3, vocab, (samples, RESPONSE_WIDTH), generator=g) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    return Batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "advantages": torch.randn(samples, RESPONSE_WIDTH, generator=g) * response_mask,
    })


def model_flops(batch, shape: dict) -> float:
    """Training FLOPs of the batch's real tokens (see the module docstring)."""
    hidden, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    kv = hidden // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inter  # q,k,v,o + gated MLP
    lengths = batch["attention_mask"].sum(-1).double()
    tokens, responses = float(lengths.sum()), float(batch["response_mask"].sum())
    return (6 * (layers * per_layer * tokens + shape["vocab_size"] * hidden * responses)
            + 6 * layers * hidden * float((lengths ** 2).sum()))


def job_config(model_path: Path, samples: int, packed: bool, device_type: str, ulysses: int = 1,
               compile_layers: bool = False):
    from rlcore.config.schema import ActorConfig, DataConfig, JobConfig, ModelConfig, OptimConfig

    micro_rows = 16
    actor = ActorConfig(ppo_mini_batch_size=samples, optim=OptimConfig(lr=1e-6),
                        ppo_micro_batch_size_per_gpu=None if packed else micro_rows,
                        use_dynamic_bsz=packed, ppo_max_token_len_per_gpu=micro_rows * (PROMPT_WIDTH + RESPONSE_WIDTH),
                        ulysses_sequence_parallel_size=ulysses, use_torch_compile=compile_layers)
    return JobConfig(
        model=ModelConfig(path=str(model_path), dtype="auto" if device_type != "cpu" else "float32",
                          enable_gradient_checkpointing=True, use_remove_padding=packed),
        actor=actor, data=DataConfig(max_prompt_length=PROMPT_WIDTH, max_response_length=RESPONSE_WIDTH),
    )


def measure(mode: str, model_path: Path, shape: dict, args, platform) -> dict:
    from rlcore.batch import Batch
    from rlcore_fsdp.attention import packed_kernel

    packed = mode == "packed+dynamic"
    config = job_config(model_path, args.samples, packed, platform.device_type, args.ulysses, args.compile)
    from rlcore.testing import build_actor
    from rlcore_fsdp.backend import FsdpBackend

    actor = build_actor(FsdpBackend(), config, platform)  # joins (or makes) the process group
    ranks = dist.get_world_size()
    whole = gsm8k_like_batch(args.samples, shape["vocab_size"])
    share = whole.select(range(rank() * args.samples // ranks, (rank() + 1) * args.samples // ranks))
    sync = platform.device_module.synchronize

    def timed(fn):
        sync()
        dist.barrier()
        start = time.perf_counter()
        out = fn()
        sync()
        dist.barrier()
        return out, time.perf_counter() - start

    old, _ = timed(lambda: actor.compute_log_prob(share))  # warm-up of the forward pass
    batch = share.update(Batch({"old_log_probs": old["old_log_probs"]}))
    actor.update(batch)  # warm-up update
    if platform.device_type != "cpu":
        platform.device_module.reset_peak_memory_stats()
    _, logprob_s = timed(lambda: actor.compute_log_prob(share))
    times = [timed(lambda: actor.update(batch))[1] for _ in range(args.steps)]
    step_s = sum(times) / len(times)
    real_tokens = int(whole["attention_mask"].sum())
    peak = platform.memory_stats()["peak_allocated"]
    result = {
        "mode": mode, "gpus": ranks, "device": platform.device_name(), "samples": args.samples,
        "real_tokens": real_tokens, "padded_tokens": whole["attention_mask"].numel(),
        "update_s": round(step_s, 3), "update_s_each": [round(t, 3) for t in times],
        "train_tokens_per_s": round(real_tokens / step_s),
        "mfu": round(model_flops(whole, shape) / step_s / (ranks * PEAK_FLOPS.get(platform.device_type, float("nan"))), 4),
        "logprob_s": round(logprob_s, 3), "logprob_tokens_per_s": round(real_tokens / logprob_s),
        "peak_memory_gib": round(peak / 2**30, 2),
        "attention": packed_kernel(platform.device_type) if packed else "sdpa (padded rows)",
        "ulysses": args.ulysses, "compiled": args.compile,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=256, help="samples per update, all ranks together")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per mode")
    parser.add_argument("--modes", default="padded,packed+dynamic")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument("--model-dir", default=None, help="where to write the random model (default: a temp dir)")
    parser.add_argument("--out", default=None, help="append the results as JSON lines to this file")
    parser.add_argument("--ulysses", type=int, default=1, help="actor.ulysses_sequence_parallel_size (packed mode only)")
    parser.add_argument("--compile", action="store_true", help="actor.use_torch_compile")
    args = parser.parse_args()

    from rlcore.runtime.distributed import ensure_process_group
    from rlcore.runtime.platforms import current_platform

    platform = current_platform()
    ensure_process_group(platform)
    shape = TINY if args.tiny else QWEN25_05B
    model_dir = Path(args.model_dir or os.path.join(tempfile.gettempdir(), "rlcore-bench-" + ("tiny" if args.tiny else "qwen25-05b")))
    model_path = build_model(shape, model_dir)
    for mode in args.modes.split(","):
        result = measure(mode, model_path, shape, args, platform)
        gc.collect()  # the mode's actor and optimizer go before the next mode's
        platform.empty_cache()
        if rank() == 0:
            print(json.dumps(result), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
