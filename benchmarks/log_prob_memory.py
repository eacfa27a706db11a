"""Peak memory and time of the targets' log-probs, forward and backward, from a (tokens, vocab) block of
logits: the plain form (every logit copied to fp32 at once, as rlcore did before 2026-12-05) against
``rlcore.algorithms.entropy.token_log_probs`` (a chunk of rows at a time), eager (``chunked``) and through
its compiled kernels (``fused``, CUDA only). Each form runs in a process of its own, once to warm up (the
compilation), then ``--repeats`` times; on a GPU the peak is ``torch.cuda.max_memory_allocated``, on the
CPU the growth of the process's peak resident set; the seconds are the repeats' median. The sizes default
to the GSM8K example's update micro-batch (``actor.ppo_max_token_len_per_gpu`` = 32768 tokens) and
SmolLM2's vocabulary; ``--entropy`` adds the entropy metric, as the update computes it.

    python benchmarks/log_prob_memory.py                      # 32768 x 49152, bf16, CPU or GPU
    python benchmarks/log_prob_memory.py --tokens 8192 --no-grad
    python benchmarks/log_prob_memory.py --entropy --forms chunked fused --repeats 5   # the GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # rlcore from this checkout, installed or not


def plain(logits: torch.Tensor, targets: torch.Tensor, entropy: bool) -> torch.Tensor:
    from rlcore.algorithms.entropy import entropy_from_logits

    scaled = logits.float()
    if entropy:
        entropy_from_logits(logits.detach())
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(-1)


def chunked(logits: torch.Tensor, targets: torch.Tensor, entropy: bool) -> torch.Tensor:
    """``token_log_probs``: eager chunks, or compiled ones where RLCORE_FUSED_LOG_PROBS allows (``fused``)."""
    from rlcore.algorithms.entropy import token_log_probs

    return token_log_probs(logits, targets, 1.0, with_entropy=entropy)[0]


def measure(form: str, tokens: int, vocab: int, grad: bool, device: str, entropy: bool, repeats: int) -> dict:
    """One form in this process: the peak memory above the logits themselves, and the median seconds."""
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=generator, device=device, dtype=torch.bfloat16).requires_grad_(grad)
    targets = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
    weights = torch.randn(tokens, generator=generator, device=device)
    compute = {"plain": plain, "chunked": chunked, "fused": chunked}[form]
    seconds, peaks = [], []
    for _ in range(1 + repeats):  # the first warms up (compiles the fused kernels)
        logits.grad = None
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        start = time.perf_counter()
        with torch.set_grad_enabled(grad):
            log_probs = compute(logits, targets, entropy)
            if grad:
                (log_probs * weights).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - base)
        else:
            peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
        seconds.append(time.perf_counter() - start)
        del log_probs
    timed = seconds[1:] or seconds
    return {"form": form, "tokens": tokens, "vocab": vocab, "grad": grad, "entropy": entropy, "device": device,
            "logits_gb": round(logits.numel() * 2 / 1e9, 2), "peak_above_logits_gb": round(max(peaks) / 1e9, 2),
            "seconds": round(statistics.median(timed), 4), "first_seconds": round(seconds[0], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--no-grad", action="store_true", help="the log-prob passes (old policy, reference)")
    parser.add_argument("--entropy", action="store_true", help="with the entropy metric (the update's forward)")
    parser.add_argument("--forms", nargs="+", choices=("plain", "chunked", "fused"), default=["plain", "chunked"])
    parser.add_argument("--repeats", type=int, default=1, help="timed runs after the warm-up")
    parser.add_argument("--one", choices=("plain", "chunked", "fused"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.one:
        print(json.dumps(measure(args.one, args.tokens, args.vocab, not args.no_grad, device, args.entropy,
                                 args.repeats)))
        return
    for form in args.forms:
        command = [sys.executable, __file__, "--one", form, "--tokens", str(args.tokens), "--vocab", str(args.vocab),
                   "--repeats", str(args.repeats), *(["--no-grad"] if args.no_grad else []),
                   *(["--entropy"] if args.entropy else [])]
        environment = dict(os.environ, RLCORE_FUSED_LOG_PROBS="1" if form == "fused" else "0")
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environment)
        if done.returncode != 0:
            sys.exit(f"the {form} form failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        print(done.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
