"""One GSM8K GRPO job, timed the same way under rlcore and TRL: seconds per step, the generation and
training parts of it, peak GPU memory and tokens per second.

The job (``examples/gsm8k_grpo_smollm2.toml``): SmolLM2-135M-Instruct, 64 prompts x 8 samples per
step, up to 512 new tokens, KL loss 0.001, lr 1e-6, no validation. Each system runs in its own
process (a fresh GPU), one after another, appending one line to the results file; ``table`` prints
what the file holds. On the GPU machine, in one sitting::

    python benchmarks/grpo_step.py rlcore-vllm --gsm8k DIR --results bench.jsonl
    python benchmarks/grpo_step.py rlcore-sglang --gsm8k DIR --results bench.jsonl  # in SGLang's environment
    python benchmarks/grpo_step.py bare-vllm   --gsm8k DIR --results bench.jsonl
    python benchmarks/grpo_step.py rlcore-hf   --gsm8k DIR --results bench.jsonl
    python benchmarks/grpo_step.py trl-vllm    --gsm8k DIR --results bench.jsonl   # needs trl
    python benchmarks/grpo_step.py trl-hf      --gsm8k DIR --results bench.jsonl   # needs trl
    python benchmarks/grpo_step.py table bench.jsonl

``DIR`` holds GSM8K's ``train.jsonl`` (``question``, ``answer``). What is measured:

- step s: rlcore's ``timing_s/step``; TRL's wall time of an optimizer step (a trainer callback). The
  median is over steps 2 to N (the first compiles and warms up).
- generation s: rlcore's ``timing_s/gen``; TRL's time inside ``GRPOTrainer._generate``;
  ``bare-vllm``: ``vllm.LLM.generate`` on the same 512 samples with rlcore's own engine arguments
  and one unseeded ``SamplingParams`` for the whole batch (the engine alone: the bound on rlcore's
  generation phase).
- training s: the step less its generation (scoring, log-probs, reference, update, weight sync).
- peak GPU memory: the most ``nvidia-smi`` showed in use on the job's GPU while it ran (the whole
  device, so an engine's reserved KV cache counts).
- tokens/s: prompt and response tokens of the step's samples per second of step.

verl beside rlcore (``verl_jobs.py``; verl 0.9.1 and vllm 0.24.0 in one environment,
``benchmarks/envs/verl-0.9.1.txt``; ``benchmarks/verl_side_by_side.sh`` runs a whole sitting)::

    python benchmarks/grpo_step.py rlcore-vllm --job a --gsm8k DIR --results bench.jsonl
    python benchmarks/grpo_step.py verl-vllm   --job a --gsm8k DIR --results bench.jsonl
    python benchmarks/grpo_step.py verl-vllm   --job grpo-line --model SHAPE --gsm8k DIR --batch 64 --mini 16
    python benchmarks/grpo_step.py rlcore-vllm --job ppo-line  --model SHAPE --gsm8k DIR --batch 64 --mini 16

``--job a`` is the example job (the default); ``grpo-line`` and ``ppo-line`` are verl's quickstart
lines with the same keys for both systems (``verl_jobs.LINES``), rlcore in lockstep
(``async_training.mode=off``), as verl's synchronous trainer. verl's times are its own ``timing_s/*``,
read from its ``file`` logger.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sitting import (EXAMPLE, MAX_NEW, PROMPTS, SAMPLES, GpuMemoryPeak,
                     RanPastDeadline, gsm8k_parquet, run_bounded)

# rlcore-<engine>: the example job with rollout.name=<engine> (rlcore-sglang: SGLang's staged environment,
# which conflicts with vLLM's; docs/engines.md)
SYSTEMS = ("rlcore-vllm", "rlcore-sglang", "rlcore-hf", "bare-vllm", "trl-vllm", "trl-hf", "verl-vllm")


# -- rlcore ----------------------------------------------------------------------------------------
def run_rlcore(engine: str, gsm8k: Path, steps: int, timeout_s: int, extra: list[str], job: str = "a",
               model: Path | None = None, batch: int | None = None, mini: int | None = None) -> dict:
    """The job under ``rlcore train`` in lockstep: job ``a`` from the example file; a verl line from
    its overrides (``verl_jobs.line_overrides``), exactly those verl would get."""
    from verl_jobs import line_overrides, steps_of

    with tempfile.TemporaryDirectory() as tmp:
        train = gsm8k_parquet(gsm8k, Path(tmp) / "data")
        run_dir = Path(tmp) / "run"
        if job == "a":
            job_args = [str(EXAMPLE), f"data.train_files=['{train}']", "data.val_files=[]",
                        f"trainer.total_training_steps={steps}", f"rollout.name={engine}"]
        else:
            val = gsm8k_parquet(gsm8k, Path(tmp) / "data", "test")
            job_args = line_overrides(job, model, train, val, steps, batch, mini)
        command = [sys.executable, "-m", "rlcore", "train", *job_args, f"trainer.default_local_dir={run_dir}",
                   "async_training.mode=off", *extra]  # lockstep, as TRL's steps and verl's sync trainer
        print("$", " ".join(command), flush=True)
        stopped = None
        with GpuMemoryPeak() as memory:
            try:
                run_bounded(command, timeout_s)
            except RanPastDeadline as deadline:  # the steps it finished are still measured, and said to be fewer
                print(deadline, flush=True)
                stopped = f"killed at {timeout_s} s"
        metrics_file = run_dir / "metrics.jsonl"
        metrics = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    return {"steps": steps_of(metrics), "peak_gpu_gb": memory.peak_gb, "overrides": command[4:], "job": job,
            **({"stopped": stopped} if stopped else {})}


def run_verl(gsm8k: Path, steps: int, timeout_s: int, extra: list[str], job: str = "a", model: Path | None = None,
             batch: int | None = None, mini: int | None = None) -> dict:
    """The job under ``python3 -m verl.trainer.main_ppo`` (``verl_jobs``): job ``a`` in verl's keys with
    the embedded SmolLM2 saved as a Hugging Face folder, or a verl line on ``model``."""
    import verl_jobs

    from rlcore.models.loading import resolve_model_path

    with tempfile.TemporaryDirectory() as tmp:
        train = gsm8k_parquet(gsm8k, Path(tmp) / "data")
        val = gsm8k_parquet(gsm8k, Path(tmp) / "data", "test")
        if job == "a":
            overrides = verl_jobs.job_a_verl(Path(resolve_model_path("embedded:smollm2-135m-instruct")), train, val, steps)
        else:
            overrides = verl_jobs.line_overrides(job, model, train, val, steps, batch, mini)
        return verl_jobs.run_verl(verl_jobs.with_overrides(overrides, extra), job, Path(tmp) / "run", timeout_s,
                                  GpuMemoryPeak())


def run_bare_vllm(gsm8k: Path, steps: int, extra: list[str]) -> dict:
    """``vllm.LLM.generate`` alone, with the engine arguments rlcore builds for the job and one
    unseeded ``SamplingParams``, on consecutive 64-prompt batches of the training set (the helpers of
    ``benchmarks/vllm_generation.py``, rlcore's flat log-probs)."""
    from vllm_generation import prompt_batches, sampling_for, start_engine

    batches, config = prompt_batches(gsm8k, steps, PROMPTS, extra)
    with GpuMemoryPeak() as memory:
        llm, model = start_engine(config, False, config.rollout.gpu_memory_utilization)  # in-process, as rlcore
        sampling = sampling_for("flat", config, model, MAX_NEW)
        steps_out = []
        for ids in batches:
            start = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in ids], sampling, use_tqdm=False)
            seconds = time.perf_counter() - start
            tokens = sum(len(p) * SAMPLES + sum(len(c.token_ids) for c in o.outputs) for p, o in zip(ids, outputs))
            steps_out.append({"step_s": seconds, "gen_s": seconds, "tokens": tokens})
    return {"steps": steps_out, "peak_gpu_gb": memory.peak_gb, "overrides": extra}


# -- TRL -------------------------------------------------------------------------------------------
def run_trl(use_vllm: bool, gsm8k: Path, steps: int) -> dict:
    """TRL's ``GRPOTrainer`` on the same job: 64 prompts x 8 samples per optimizer step (64
    completions per device batch, 8 accumulation steps, one generation round per step), rlcore's
    prompt, a reward for the right ``#### n``."""
    import re

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    from rlcore.data.gsm8k import INSTRUCTION, final_answer
    from rlcore.models.loading import resolve_model_path

    model = resolve_model_path("embedded:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    records = [json.loads(line) for line in (gsm8k / "train.jsonl").read_text().splitlines()][:PROMPTS * (steps + 1)]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{r['question']} {INSTRUCTION}"}],
                                  "ground_truth": final_answer(r["answer"])} for r in records])
    marked = re.compile(r"#### (\-?[0-9\.\,]+)")

    def gsm8k_reward(completions, ground_truth, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [float(bool(found) and found[-1].replace(",", "") == truth)
                for found, truth in zip(map(marked.findall, texts), ground_truth)]

    class StepClock(TrainerCallback):
        def __init__(self):
            self.steps, self.generating = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.generating = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.steps.append({"step_s": time.perf_counter() - self.start, "gen_s": self.generating})

    clock = StepClock()
    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=PROMPTS, num_generations=SAMPLES,
        gradient_accumulation_steps=SAMPLES, max_completion_length=MAX_NEW, learning_rate=1e-6, beta=0.001,
        temperature=1.0, top_p=1.0, bf16=True, logging_steps=1, max_steps=steps, report_to=[],
        save_strategy="no", seed=0, log_completions=False,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if use_vllm else {}))
    trainer = trl.GRPOTrainer(model=model, reward_funcs=gsm8k_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[clock])
    generate = trainer._generate

    def timed_generate(*a, **kw):
        start = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            clock.generating += time.perf_counter() - start

    trainer._generate = timed_generate
    with GpuMemoryPeak() as memory:
        trainer.train()
    tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    for step, (before, after) in zip(clock.steps, zip([0, *tokens], tokens)):
        step["tokens"] = after - before
    return {"steps": clock.steps, "peak_gpu_gb": memory.peak_gb, "trl": trl.__version__}


# -- results ---------------------------------------------------------------------------------------
def summary(record: dict) -> dict:
    steps = record["steps"][1:] or record["steps"]  # steps 2..N: the first compiles and warms up
    step_s = statistics.median(s["step_s"] for s in steps)
    gen_s = statistics.median(s["gen_s"] for s in steps)
    tokens = [s["tokens"] / s["step_s"] for s in steps if s.get("tokens")]
    return {"step_s": step_s, "gen_s": gen_s, "train_s": step_s - gen_s,
            "range": (min(s["step_s"] for s in steps), max(s["step_s"] for s in steps)),
            "tokens_per_s": statistics.median(tokens) if tokens else None}


def table(results: Path) -> str:
    if not results.is_file():
        return f"(no results: {results} was not written; every run failed before its first record)"
    records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    lines = ["| job | system | s/step (median, range) | generation s | training s | peak GPU GB | tokens/s |",
             "|---|---|---|---|---|---|---|"]
    for record in records:
        if not record["steps"]:
            lines.append(f"| {record.get('job', 'a')} | {record['system']} | no step finished "
                         f"({record.get('stopped', '')}) | - | - | - | - |")
            continue
        s = summary(record)
        tokens = f"{s['tokens_per_s']:,.0f}" if s["tokens_per_s"] else "-"
        system = record["system"] + (f" ({len(record['steps'])} steps, then {record['stopped']})"
                                     if record.get("stopped") else "")
        lines.append(f"| {record.get('job', 'a')} | {system} | {s['step_s']:.2f} "
                     f"({s['range'][0]:.2f}-{s['range'][1]:.2f}) | {s['gen_s']:.2f} | {s['train_s']:.2f} | "
                     f"{record['peak_gpu_gb'] or '-'} | {tokens} |")
    for job in dict.fromkeys(r.get("job", "a") for r in records):
        of_job = [r for r in records if r.get("job", "a") == job]
        vllm = next((summary(r) for r in of_job if r["system"] == "rlcore-vllm" and r["steps"]), None)
        for other in ("trl-vllm", "bare-vllm", "verl-vllm"):
            found = next((summary(r) for r in of_job if r["system"] == other and r["steps"]), None)
            if vllm and found:
                what = "generation" if other == "bare-vllm" else "step"
                key = "gen_s" if other == "bare-vllm" else "step_s"
                lines.append(f"\n{job}: rlcore-vllm / {other} ({what}): {vllm[key] / found[key]:.2f}")
                if other == "verl-vllm":
                    lines.append(f"{job}: rlcore-vllm / verl-vllm (non-generation s): "
                                 f"{vllm['train_s'] / found['train_s']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=(*SYSTEMS, "table"))
    parser.add_argument("results", nargs="?", type=Path, help="(table) the results file")
    parser.add_argument("--gsm8k", type=Path, help="folder holding GSM8K's train.jsonl")
    parser.add_argument("--results", dest="out", type=Path, default=Path("bench.jsonl"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=540, help="seconds an rlcore or verl job may take")
    parser.add_argument("--job", choices=("a", "grpo-line", "ppo-line"), default="a",
                        help="(rlcore-vllm, verl-vllm) the example job, or one of verl's quickstart lines")
    parser.add_argument("--model", type=Path, help="(the lines) the model folder, e.g. from benchmarks/shapes.py")
    parser.add_argument("--batch", type=int, help="(the lines) data.train_batch_size, for both systems")
    parser.add_argument("--mini", type=int, help="(the lines) actor_rollout_ref.actor.ppo_mini_batch_size")
    parser.add_argument("--label", help="the row's name in the results (default: the system's)")
    parser.add_argument("overrides", nargs="*", help="more overrides (rlcore and verl systems)")
    args, extra = parser.parse_known_args(argv)
    if args.system == "table":
        print(table(args.results or args.out))
        return 0
    if args.gsm8k is None:
        parser.error("--gsm8k DIR is needed to run a system")
    overrides = [*args.overrides, *extra]
    if args.job != "a" and (args.model is None or args.system not in ("rlcore-vllm", "verl-vllm")):
        parser.error(f"--job {args.job} runs under rlcore-vllm or verl-vllm and needs --model DIR")
    lines = {"job": args.job, "model": args.model, "batch": args.batch, "mini": args.mini}
    if args.system.startswith("rlcore-"):
        record = run_rlcore(args.system.removeprefix("rlcore-"), args.gsm8k, args.steps, args.timeout, overrides,
                            **lines)
    elif args.system == "verl-vllm":
        record = run_verl(args.gsm8k, args.steps, args.timeout, overrides, **lines)
    elif args.system == "bare-vllm":
        record = run_bare_vllm(args.gsm8k, args.steps, overrides)
    else:
        record = run_trl(args.system == "trl-vllm", args.gsm8k, args.steps)
    record = {"system": args.label or args.system, "date": datetime.date.today().isoformat(), **record}
    with args.out.open("a") as out:
        out.write(json.dumps(record) + "\n")
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
