"""``rlcore train`` in this process under a debugging lens, for hunting non-finite gradients on a GPU.

    python3 benchmarks/debug_train.py [--anomaly] [--sdpa-kernels flash,cudnn,math] [--trace-nonfinite]
                                      [--line ppo-line --model DIR --gsm8k DIR [--batch B --mini M]
                                       [--steps N] --run-dir DIR] -- OVERRIDES...

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
- ``--profile-grads PASSES``: for the first PASSES backward passes of each model, each decoder layer's
  largest incoming gradient, the row and position where it sits, the token and mask value there and
  the layer's input rms at that position: where a gradient grows layer by layer, at which tokens.

- ``--line``: one of verl's quickstart lines (``verl_jobs.line_overrides``: the issue's keys, data from
  GSM8K's jsonl files written as parquet into the run folder) in lockstep (``async_training.mode=off``),
  before the OVERRIDES.

The job runs with ``trainer.ray = false`` (added by ``--line``; otherwise add it to the overrides), so
the trainer's update runs here.
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


def on_each_new_model(watch) -> None:
    """Call ``watch(model, number)`` once for every Hugging Face model of this process, at its first forward
    (numbered from 1 in the order they first run)."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from transformers import PreTrainedModel

    seen: set[int] = set()

    def on_forward(module, _inputs):
        if isinstance(module, PreTrainedModel) and id(module) not in seen:
            seen.add(id(module))
            watch(module, len(seen))

    register_module_forward_pre_hook(on_forward)


def trace_nonfinite(limit: int = 5) -> NonfiniteTrace:
    """Watch every Hugging Face model of this process from its first forward on (``NonfiniteTrace``)."""
    trace = NonfiniteTrace(limit)
    on_each_new_model(lambda model, number: trace.watch(model, prefix=f"model {number}: "))
    return trace


class GradProfile:
    """For the first ``passes`` backward passes of each watched model: each decoder layer's largest
    incoming gradient, where it sits (row, position), the token there and its attention-mask value, and
    the root-mean-square of the layer's input at that position (``lines``, also printed). Where a
    gradient grows layer by layer, this says at which tokens."""

    def __init__(self, passes: int = 1, echo=print):
        self.passes, self.echo = passes, echo
        self.lines: list[str] = []
        self.inputs: dict[int, tuple] = {}  # model id -> (input_ids, attention_mask) of its last forward
        self.input_rms: dict[int, object] = {}  # layer id -> (B, T) rms of its last forward's input
        self.backwards: dict[tuple[int, int], int] = {}  # (model id, layer index) -> backward passes seen

    def watch(self, model, label: str) -> None:
        import re

        def remember_inputs(_module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.inputs[id(model)] = (ids, kwargs.get("attention_mask"))

        model.register_forward_pre_hook(remember_inputs, with_kwargs=True)
        for name, module in model.named_modules():
            found = re.search(r"layers\.(\d+)$", name)
            if found:
                module.register_forward_hook(self._forward_hook())
                module.register_full_backward_hook(self._backward_hook(model, int(found.group(1)), label))

    def _forward_hook(self):
        def hook(module, inputs, _output):
            hidden = _tensors(inputs)
            if hidden:
                self.input_rms[id(module)] = hidden[0].detach().float().pow(2).mean(-1).sqrt()
        return hook

    def _backward_hook(self, model, index: int, label: str):
        def hook(module, _grad_input, grad_output):
            key = (id(model), index)
            self.backwards[key] = self.backwards.get(key, 0) + 1
            arriving = _tensors(grad_output)
            if self.backwards[key] > self.passes or not arriving:
                return
            size = arriving[0].detach().float().abs().nan_to_num(float("inf")).amax(-1)  # (B, T)
            flat = int(size.argmax())
            row, pos = divmod(flat, size.shape[-1])
            ids, mask = self.inputs.get(id(model), (None, None))
            token = int(ids[row, pos]) if ids is not None and ids.dim() == 2 else None
            masked = int(mask[row, pos]) if mask is not None and mask.dim() == 2 else None
            rms = self.input_rms.get(id(module))
            line = (f"{label} layer {index} backward {self.backwards[key]}: gradient max {float(size.max()):.4g} "
                    f"at row {row} position {pos} of {size.shape[-1]} (token {token}, mask {masked}, input rms "
                    f"there {float(rms[row, pos]) if rms is not None else float('nan'):.4g}, smallest input rms "
                    f"{float(rms.min()) if rms is not None else float('nan'):.4g})")
            self.lines.append(line)
            self.echo(line, flush=True)
        return hook


def profile_grads(passes: int = 1) -> GradProfile:
    """Profile every Hugging Face model of this process from its first forward on (``GradProfile``)."""
    profile = GradProfile(passes)
    on_each_new_model(lambda model, number: profile.watch(model, f"model {number} ({type(model).__name__})"))
    return profile


def grad_norms(run_dir: Path) -> list[dict]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return []
    return [{k: v for k, v in json.loads(line).items() if k.endswith(("grad_norm", "nonfinite_updates", "step"))}
            for line in metrics.read_text().splitlines() if line.strip()]


def line_arguments(job: str, model: Path, gsm8k: Path, run_dir: Path, steps: int = 1, batch: int | None = None,
                   mini: int | None = None) -> list[str]:
    """``rlcore train``'s arguments for verl's line ``job`` on ``model``: lockstep, in this process, the
    run (and GSM8K as parquet) in ``run_dir``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sitting import gsm8k_parquet
    from verl_jobs import line_overrides

    data = run_dir / "data"
    train, val = gsm8k_parquet(gsm8k, data), gsm8k_parquet(gsm8k, data, "test")
    return [*line_overrides(job, model.resolve(), train, val, steps, batch, mini), "async_training.mode=off",
            "trainer.ray=false", f"trainer.default_local_dir={run_dir / 'run'}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anomaly", action="store_true", help="autograd's anomaly mode, NaN checks on")
    parser.add_argument("--sdpa-kernels", help="comma-separated kernels SDPA may use (flash, efficient, cudnn, math)")
    parser.add_argument("--trace-nonfinite", action="store_true",
                        help="name the first modules whose backward turns a finite gradient non-finite")
    parser.add_argument("--profile-grads", type=int, metavar="PASSES",
                        help="each decoder layer's largest gradient and where it sits, for the first PASSES "
                             "backward passes of each model")
    parser.add_argument("--line", choices=("ppo-line", "grpo-line"), help="one of verl's quickstart lines")
    parser.add_argument("--model", type=Path, help="(--line) the model folder (benchmarks/shapes.py)")
    parser.add_argument("--gsm8k", type=Path, help="(--line) the folder of GSM8K's train.jsonl and test.jsonl")
    parser.add_argument("--run-dir", type=Path, help="(--line) where the data and the run go")
    parser.add_argument("--steps", type=int, default=1, help="(--line) trainer.total_training_steps")
    parser.add_argument("--batch", type=int, help="(--line) data.train_batch_size")
    parser.add_argument("--mini", type=int, help="(--line) ppo_mini_batch_size")
    parser.add_argument("overrides", nargs="*", help="rlcore train's arguments (a job file, key=value overrides)")
    args = parser.parse_args(argv)
    if args.line:
        if not (args.model and args.gsm8k and args.run_dir):
            parser.error("--line needs --model, --gsm8k and --run-dir")
        args.overrides = [*line_arguments(args.line, args.model, args.gsm8k, args.run_dir, args.steps, args.batch,
                                          args.mini), *args.overrides]
    if args.sdpa_kernels:
        restrict_sdpa([name.strip() for name in args.sdpa_kernels.split(",") if name.strip()])
    if args.anomaly:
        anomaly_everywhere()
    if args.trace_nonfinite:
        trace_nonfinite()
    if args.profile_grads:
        profile_grads(args.profile_grads)
    from rlcore.cli import main as rlcore_main

    code = rlcore_main(["train", *args.overrides])
    run_dir = next((Path(o.split("=", 1)[1]) for o in reversed(args.overrides)
                    if o.startswith("trainer.default_local_dir=")), None)
    for row in grad_norms(run_dir) if run_dir else []:
        print("grad norms:", row, flush=True)
    return code


if __name__ == "__main__":  # a spawned reward worker imports this file again: the job must not rerun there
    sys.exit(main())
