"""Peak memory and time of the targets' log-probs, forward and backward, from a (tokens, vocab) block of
logits: the plain form (every logit copied to fp32 at once, as rlcore did before 2026-12-05) against
``rlcore.algorithms.entropy.token_log_probs`` (a chunk of rows at a time). Each form runs in a process of
its own; on a GPU the peak is ``torch.cuda.max_memory_allocated``, on the CPU the growth of the process's
peak resident set. The sizes default to the GSM8K example's update micro-batch (``actor.ppo_max_token_len_per_gpu``
= 32768 tokens) and SmolLM2's vocabulary.

    python benchmarks/log_prob_memory.py                      # 32768 x 49152, bf16, CPU or GPU
    python benchmarks/log_prob_memory.py --tokens 8192 --no-grad
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def plain(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    scaled = logits.float()
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1)


def chunked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from rlcore.algorithms.entropy import token_log_probs

    return token_log_probs(logits, targets, 1.0, with_entropy=False)[0]


def measure(form: str, tokens: int, vocab: int, grad: bool, device: str) -> dict:
    """One form in this process: the peak memory above the logits themselves, and the seconds."""
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=generator, device=device, dtype=torch.bfloat16).requires_grad_(grad)
    targets = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
    weights = torch.randn(tokens, generator=generator, device=device)
    compute = {"plain": plain, "chunked": chunked}[form]
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        log_probs = compute(logits, targets)
        if grad:
            (log_probs * weights).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"form": form, "tokens": tokens, "vocab": vocab, "grad": grad, "device": device,
            "logits_gb": round(logits.numel() * 2 / 1e9, 2), "peak_above_logits_gb": round(peak / 1e9, 2),
            "seconds": round(time.perf_counter() - start, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--no-grad", action="store_true", help="the log-prob passes (old policy, reference)")
    parser.add_argument("--one", choices=("plain", "chunked"), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.one:
        print(json.dumps(measure(args.one, args.tokens, args.vocab, not args.no_grad, device)))
        return
    for form in ("plain", "chunked"):
        command = [sys.executable, __file__, "--one", form, "--tokens", str(args.tokens), "--vocab", str(args.vocab),
                   *(["--no-grad"] if args.no_grad else [])]
        print(subprocess.run(command, check=True, capture_output=True, text=True, timeout=900).stdout.strip(),
              flush=True)


if __name__ == "__main__":
    main()
