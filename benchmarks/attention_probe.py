"""Are a padded training forward's gradients finite, kernel by kernel? A probe for the NaN gradients
on the qwen2.5-0.5b shape (docs/benchmarks.md, 2026-12-03), run on the GPU machine:

    python3 benchmarks/attention_probe.py [--shape qwen2.5-0.5b] [--lengths 576,704,1024,1088] [--rows 8]

The shape is built in memory (random bf16 weights, ``benchmarks/shapes.py``). Rows are laid out as
the rollout hands them over: prompts left-padded (so some queries see no key at all), responses
right-padded. For each total length and each way of attending, one forward and backward of the
response tokens' mean log-prob; printed: how many parameter gradients hold a non-finite value, the
gradient norm, and its relative distance from the math kernel's (the reference). Ways of attending:

- ``sdpa``: transformers' SDPA with the kernels torch picks; ``sdpa:cudnn``, ``sdpa:efficient``,
  ``sdpa:math``: the same held to one kernel (``torch.nn.attention.sdpa_kernel``);
- ``rlcore padded``: rlcore's attention for padded rows (``rlcore_fsdp.attention``: no fully masked
  query row, no cuDNN for masked calls);
- ``rlcore packed``: the rows packed (``model.use_remove_padding``: varlen FlashAttention, no mask).

Lengths 64 past a multiple of 128 (576, 704, 1088) are where pytorch/pytorch#196678 reports cuDNN's
masked backward failing on H100/H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WAYS = ("sdpa", "sdpa:cudnn", "sdpa:efficient", "sdpa:math", "rlcore padded", "rlcore packed")


def padded_rows(rows: int, length: int, vocab: int, seed: int):
    """A rollout-shaped batch of ``rows`` rows ``length`` wide: a quarter prompt (left pads), the rest
    response (right pads)."""
    from rlcore.batch import Batch

    g = torch.Generator().manual_seed(seed)
    prompt, response = length // 4, length - length // 4
    ids = torch.randint(3, vocab, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for row in range(rows):
        mask[row, : int(torch.randint(0, prompt - 1, (1,), generator=g))] = 0
        mask[row, prompt + int(torch.randint(1, response, (1,), generator=g)):] = 0
    mask[0, :] = 1  # one full row, as the longest prompt and a response that ran to its limit
    ids = torch.where(mask.bool(), ids, 2)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, prompt:], "response_mask": mask[:, prompt:]})


def kernel_context(way: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH}
    return sdpa_kernel([kernels[way.split(":")[1]]]) if ":" in way else nullcontext()


def gradients(model, batch, way: str, device) -> dict[str, torch.Tensor]:
    """Each parameter's gradient of the response tokens' mean log-prob, attending the ``way`` way."""
    from rlcore_fsdp.attention import use_packed_attention
    from rlcore_fsdp.forward import log_probs_and_entropy

    model.zero_grad(set_to_none=True)
    if way.startswith("rlcore"):
        use_packed_attention(model)
    else:
        model.set_attn_implementation("sdpa")
    with kernel_context(way):
        log_probs, _, _ = log_probs_and_entropy(model, batch, device, 1.0, False, packed=way == "rlcore packed")
        mask = batch["response_mask"].to(device).bool()
        loss = -log_probs[mask].float().mean()
        loss.backward()
    return {name: p.grad.detach().float() for name, p in model.named_parameters() if p.grad is not None}


def norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((g.nan_to_num(0, 0, 0) ** 2).sum() for g in grads.values())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b")
    parser.add_argument("--lengths", default="576,640,704,1024,1088")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--results", type=Path, help="append one JSON line per (length, way) here")
    parser.add_argument("--device", default="cuda", help="where to run (cpu: a smoke test of the probe itself)")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from shapes import shape_config

    device = torch.device(args.device)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(args.shape), dtype=torch.bfloat16)
    where = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    print(f"{args.shape} on {where}, torch {torch.__version__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters", flush=True)
    print("| length | way | non-finite gradients | grad norm | relative distance from math | s |")
    print("|---|---|---|---|---|---|")
    for length in (int(x) for x in args.lengths.split(",")):
        batch = padded_rows(args.rows, length, model.config.vocab_size, seed=length)
        reference = None
        for way in ("sdpa:math", *(w for w in WAYS if w != "sdpa:math")):
            start = time.perf_counter()
            try:
                grads = gradients(model, batch, way, device)
            except RuntimeError as exc:  # a kernel that does not take these inputs
                print(f"| {length} | {way} | did not run: {str(exc).splitlines()[0][:90]} | | | |", flush=True)
                continue
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            bad = sum(int(not torch.isfinite(g).all()) for g in grads.values())
            distance = None
            if reference is None:
                reference = grads
            elif not bad:
                diff = {k: grads[k] - reference[k] for k in grads}
                distance = norm(diff) / max(norm(reference), 1e-12)
            row = {"length": length, "way": way, "nonfinite": bad, "of": len(grads), "grad_norm": norm(grads),
                   "distance_from_math": distance, "seconds": round(seconds, 3)}
            shown = "-" if distance is None else f"{distance:.2e}"
            print(f"| {length} | {way} | {bad} of {len(grads)} | {row['grad_norm']:.4g} | {shown} | {seconds:.2f} |",
                  flush=True)
            if args.results:
                with args.results.open("a") as f:
                    f.write(json.dumps({"shape": args.shape, "torch": torch.__version__, **row}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
