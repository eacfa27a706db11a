"""``rlcore train`` in this process under a debugging lens, for hunting non-finite gradients on a GPU.

    python3 benchmarks/debug_train.py [--anomaly] [--sdpa-kernels flash,cudnn,math] -- OVERRIDES...

- ``--anomaly``: autograd's anomaly mode on every forward and backward
  (``torch.autograd.detect_anomaly(check_nan=True)``): the first operation whose backward returns NaN
  raises, naming it and the forward line that made it (slow: one step is enough).
- ``--sdpa-kernels``: ``torch.nn.functional.scaled_dot_product_attention`` may use only these kernels
  (``torch.nn.attention.SDPBackend``: flash, efficient, cudnn, math), everywhere in the process: to
  test whether one kernel's backward is the culprit (on 2026-12-03 the memory-efficient kernel's, with
  an attention mask, on the qwen2.5-0.5b shape; docs/benchmarks.md).

The job runs with ``trainer.ray = false`` (add it to the overrides), so the trainer's update runs here.
Each finished step's grad norms are printed from the run's ``metrics.jsonl`` at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
           "math": "MATH"}


def restrict_sdpa(names: list[str]) -> None:
    """Every SDPA call of this process under ``sdpa_kernel`` with only ``names``'s kernels."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    unknown = sorted(set(names) - set(KERNELS))
    if unknown:
        raise SystemExit(f"unknown SDPA kernels {unknown}; choose from {', '.join(KERNELS)}")
    backends = [getattr(SDPBackend, KERNELS[name]) for name in names]
    original = getattr(F.scaled_dot_product_attention, "__wrapped__", F.scaled_dot_product_attention)  # unwrap a restriction

    @functools.wraps(original)
    def restricted(*args, **kwargs):
        with sdpa_kernel(backends):
            return original(*args, **kwargs)

    F.scaled_dot_product_attention = restricted


def anomaly_everywhere() -> None:
    """Anomaly mode in this thread and in every backward, whichever thread calls it."""
    import torch

    torch.autograd.set_detect_anomaly(True, check_nan=True)
    backward = torch.Tensor.backward

    def checked_backward(self, *args, **kwargs):
        with torch.autograd.detect_anomaly(check_nan=True):
            return backward(self, *args, **kwargs)

    torch.Tensor.backward = checked_backward


def grad_norms(run_dir: Path) -> list[dict]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return []
    return [{k: v for k, v in json.loads(line).items() if k.endswith(("grad_norm", "nonfinite_updates", "step"))}
            for line in metrics.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anomaly", action="store_true", help="autograd's anomaly mode, NaN checks on")
    parser.add_argument("--sdpa-kernels", help="comma-separated kernels SDPA may use (flash, efficient, cudnn, math)")
    parser.add_argument("overrides", nargs="*", help="rlcore train's arguments (a job file, key=value overrides)")
    args = parser.parse_args(argv)
    if args.sdpa_kernels:
        restrict_sdpa([name.strip() for name in args.sdpa_kernels.split(",") if name.strip()])
    if args.anomaly:
        anomaly_everywhere()
    from rlcore.cli import main as rlcore_main

    code = rlcore_main(["train", *args.overrides])
    run_dir = next((Path(o.split("=", 1)[1]) for o in args.overrides if o.startswith("trainer.default_local_dir=")),
                   None)
    for row in grad_norms(run_dir) if run_dir else []:
        print("grad norms:", row, flush=True)
    return code


if __name__ == "__main__":  # a spawned reward worker imports this file again: the job must not rerun there
    sys.exit(main())
