"""``rlcore train`` in this process under a debugging lens, for hunting non-finite gradients on a GPU.

    python3 benchmarks/debug_train.py [--anomaly] [--sdpa-kernels flash,cudnn,math] [--trace-nonfinite]
                                      -- OVERRIDES...

- ``--anomaly``: autograd's anomaly mode on every forward and backward
  (``torch.autograd.detect_anomaly(check_nan=True)``): the first operation whose backward returns NaN
  raises, naming it and the forward line that made it (slow: one step is enough).
- ``--sdpa-kernels``: ``torch.nn.functional.scaled_dot_product_attention`` may use only these kernels
  (``torch.nn.attention.SDPBackend``: flash, efficient, cudnn, math), everywhere in the process: to
  test whether one kernel's backward is the culprit (on 2026-12-03 the memory-efficient kernel's, with
  an attention mask, on the qwen2.5-0.5b shape; docs/benchmarks.md).
- ``--trace-nonfinite``: every module of every Hugging Face model the job runs is watched in backward;
  the first modules whose incoming gradient is finite but whose outgoing one is not (inf counts, which
  anomaly mode's NaN check misses) are printed with their names, and with the largest values their last
  forward saw and gave: where a finite backward first turns non-finite, and on what inputs.

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


def _tensors(values) -> list:
    import torch

    values = values if isinstance(values, tuple | list) else (values,)
    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


def _largest(tensors: list) -> float:
    return max((float(t.detach().abs().nan_to_num(float("inf")).amax()) for t in tensors if t.numel()), default=0.0)


def _finite(tensors: list) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in tensors)


class NonfiniteTrace:
    """Backward hooks on named modules: a report line for each of the first ``limit`` modules whose
    gradient arrives finite and leaves non-finite (``lines``, also printed)."""

    def __init__(self, limit: int = 5, echo=print):
        self.limit, self.echo = limit, echo
        self.lines: list[str] = []
        self.last_forward: dict[int, tuple[float, float]] = {}
        self.watched: set[int] = set()

    def watch(self, model, prefix: str = "") -> None:
        """Hook every submodule of ``model`` (once), named ``prefix`` + its qualified name."""
        for name, module in model.named_modules():
            if id(module) in self.watched:
                continue
            self.watched.add(id(module))
            label = f"{prefix}{name or type(model).__name__} ({type(module).__name__})"
            module.register_forward_hook(self._forward_hook())
            module.register_full_backward_hook(self._backward_hook(label))

    def _forward_hook(self):
        def hook(module, inputs, output):
            self.last_forward[id(module)] = (_largest(_tensors(inputs)), _largest(_tensors(output)))
        return hook

    def _backward_hook(self, label: str):
        def hook(module, grad_input, grad_output):
            if len(self.lines) >= self.limit:
                return
            arriving, leaving = _tensors(grad_output), _tensors(grad_input)
            if _finite(arriving) and not _finite(leaving):
                seen_in, gave = self.last_forward.get(id(module), (float("nan"), float("nan")))
                line = (f"non-finite backward starts in {label}: gradient in max {_largest(arriving):.4g}, "
                        f"out non-finite; its last forward: inputs max {seen_in:.4g}, outputs max {gave:.4g}")
                self.lines.append(line)
                self.echo(line, flush=True)
        return hook


def trace_nonfinite(limit: int = 5) -> NonfiniteTrace:
    """Watch every Hugging Face model of this process from its first forward on (``NonfiniteTrace``)."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from transformers import PreTrainedModel

    trace = NonfiniteTrace(limit)
    count = [0]

    def on_forward(module, _inputs):
        if isinstance(module, PreTrainedModel) and id(module) not in trace.watched:
            count[0] += 1
            trace.watch(module, prefix=f"model {count[0]}: ")

    register_module_forward_pre_hook(on_forward)
    return trace


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
    parser.add_argument("--trace-nonfinite", action="store_true",
                        help="name the first modules whose backward turns a finite gradient non-finite")
    parser.add_argument("overrides", nargs="*", help="rlcore train's arguments (a job file, key=value overrides)")
    args = parser.parse_args(argv)
    if args.sdpa_kernels:
        restrict_sdpa([name.strip() for name in args.sdpa_kernels.split(",") if name.strip()])
    if args.anomaly:
        anomaly_everywhere()
    if args.trace_nonfinite:
        trace_nonfinite()
    from rlcore.cli import main as rlcore_main

    code = rlcore_main(["train", *args.overrides])
    run_dir = next((Path(o.split("=", 1)[1]) for o in args.overrides if o.startswith("trainer.default_local_dir=")),
                   None)
    for row in grad_norms(run_dir) if run_dir else []:
        print("grad norms:", row, flush=True)
    return code


if __name__ == "__main__":  # a spawned reward worker imports this file again: the job must not rerun there
    sys.exit(main())
