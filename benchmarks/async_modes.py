"""Step times of one GRPO job in lockstep and in the asynchronous forms (docs/async.md).

Run::

    # CPU, the tiny random Qwen2 of the tests and a GSM8K slice (rlcore data gsm8k ... --input):
    python benchmarks/async_modes.py --data DIR_WITH_train.parquet --out async.json
    # any job file, e.g. the GSM8K job on the GPU machine (extra overrides after --):
    python benchmarks/async_modes.py --job examples/gsm8k_grpo_smollm2.toml --gsm8k DIR --steps 20 --out async.json -- \\
        trainer.n_gpus_per_node=2

Each run is ``rlcore train`` in a process of its own (``--modes``: ``off``, ``split``, ``colocated``;
``--staleness`` 0 and 1 for the asynchronous ones); the table gives the median over steps 2.. of
``timing_s/step``, the trainer's wait for its batch (``timing_s/gen``), the engine's own generation,
``update_actor``, the weight sync and samples per second. ``--sharing`` runs the colocated form once per
``async_training.device_sharing`` given (``concurrent``: the trainer's and the engine's kernels at once,
through CUDA MPS on NVIDIA GPUs; ``time_slicing``: by turns). The asynchronous runs apply rollout
importance sampling (threshold 2), or (``--correction`` takes several, one run each) with ``--correction bypass`` take the engine's log-probs as the
old policy's (``algorithm.rollout_bypass``: the PPO ratio against the rollout policy, no old log-prob
pass), or with ``--correction none`` neither: no rollout log-probs at all (``rollout.calculate_log_probs
= false``, which spares the engine about a third of its generation time with vLLM) and stale samples
train uncorrected, as in verl's one-step-off-policy trainer by default; to time lockstep alike, add
``-- rollout.calculate_log_probs=false``. The split form gets ``--split-overrides`` too (default: one
trainer worker and one rollout worker).

``--profile STEP ...`` traces those steps of every run with torch's profiler (``profiler.steps``,
docs/profiling.md): a second table gives each traced step's busy time per process and, where the trainer
and the engine share a device, how long both, either and neither ran kernels. Traced steps are left out of
the step-time medians (the profiler slows them down).

``--out`` keeps, after each run, the table's rows, each run's seconds step by step (``step_s``), the
median of each of its ``timing_s/*`` phases (``timing_s``) and the profile rows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sitting import CORRECTIONS, RanPastDeadline, gsm8k_parquet, run_bounded

TINY_JOB = ["data.train_batch_size=4", "data.max_prompt_length=512", "data.max_response_length=192",
            "data.filter_overlong_prompts=true", "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-4",
            "algorithm.adv_estimator=grpo", "rollout.n=4", "trainer.n_gpus_per_node=1"]
QUIET = ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", 'trainer.logger=["console"]']
COLUMNS = (("s/step", "timing_s/step"), ("gen wait", "timing_s/gen"), ("engine", "timing_s/gen/engine"),
           ("update_actor", "timing_s/update_actor"), ("sync", "timing_s/update_weights"))


def run(name: str, overrides: list[str], out_dir: Path, timeout: int) -> tuple[list[dict], str | None]:
    """One run in a session of its own (``sitting.run_bounded``: past ``timeout`` it is killed with every
    process it started, so none holds the GPU for the next run). Returns the steps it finished and, for a
    run killed at its deadline or failed, why; the log's last lines are printed, and the next run goes on."""
    run_dir = out_dir / name
    env = os.environ | {"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    log_file = out_dir / f"{name}.log"
    stopped = None
    with open(log_file, "w") as log:
        try:
            run_bounded([sys.executable, "-m", "rlcore", "train", *overrides,
                         f'trainer.default_local_dir="{run_dir}"'], timeout, stdout=log, stderr=subprocess.STDOUT,
                        env=env)
        except RanPastDeadline:
            stopped = f"killed at {timeout} s"
        except SystemExit as failure:
            stopped = f"failed: {failure}"
    if stopped:
        tail = log_file.read_text(errors="replace").splitlines()[-12:]
        print(f"{name}: {stopped}; the end of {log_file}:\n  " + "\n  ".join(tail), flush=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    return metrics, stopped


def measured_steps(metrics: list[dict], traced: tuple[int, ...] = ()) -> list[dict]:
    """The steps the medians read: 2.. (all steps where there are no others), traced steps left out."""
    return [m for m in metrics if m["step"] >= 2 and m["step"] not in traced] or metrics


def summarize(metrics: list[dict], samples_per_step: int, traced: tuple[int, ...] = (),
              stopped: str | None = None) -> dict:
    """The medians over steps 2.. (all steps where there are no others), traced steps left out; a run cut
    short says so and how many steps it finished."""
    later = measured_steps(metrics, traced)
    if not later:
        return {label: None for label, _ in COLUMNS} | {"samples/s": None, "steps": 0, "stopped": stopped}
    row = {label: statistics.median(m.get(key, 0.0) for m in later) for label, key in COLUMNS}
    row |= {"samples/s": samples_per_step / row["s/step"], "steps": len(metrics)}
    return row | ({"stopped": stopped} if stopped else {})


def phase_medians(metrics: list[dict], traced: tuple[int, ...] = ()) -> dict[str, float]:
    """The median of every ``timing_s/*`` key over the measured steps, for the results file: where
    the rest of a step goes (scoring, advantages, the driver's own work) beside the table's columns."""
    later = measured_steps(metrics, traced)
    keys = sorted({key for m in later for key in m if key.startswith("timing_s/")})
    return {key: round(statistics.median(m[key] for m in later if key in m), 3) for key in keys}


def step_phases(metrics: list[dict]) -> dict[int, dict[str, float]]:
    """Each step's table columns and reference pass, for the results file: which side a step waited for
    (steps that alternate between the trainer's time and the engine's show it here, not in a median)."""
    keys = (*COLUMNS, ("ref", "timing_s/ref"))
    return {m["step"]: {label: round(m[key], 3) for label, key in keys if key in m} for m in metrics}


def step_times(metrics: list[dict]) -> dict[int, float]:
    """Each step's seconds (``timing_s/step``), for the results file: a median hides which steps were slow."""
    return {step: phases["s/step"] for step, phases in step_phases(metrics).items() if "s/step" in phases}


def traceable_steps(requested: list[int], steps: int) -> list[int]:
    """The ``--profile`` steps a run of ``steps`` steps reaches; the others are dropped with a note, not
    handed to the job (whose configuration check refuses a traced step after the last: a queued
    three-step run lost its whole sitting slot to that on 2026-12-06)."""
    kept = [step for step in requested if step <= steps]
    if kept != requested:
        print(f"--profile: steps {sorted(set(requested) - set(kept))} come after the last of {steps} steps; "
              f"{'tracing ' + str(kept) if kept else 'no trace'}", flush=True)
    return kept


def profile_rows(run_dir: Path) -> list[dict]:
    """One row per traced step of a run: each process's busy seconds (device kernels, else CPU operators)
    and, for processes sharing a device, seconds both, either and neither were busy."""
    rows = []
    for summary_file in sorted((run_dir / "profile").glob("step_*/summary.json")):
        summary = json.loads(summary_file.read_text())
        row = {"step": summary["step"]}
        for process in summary["processes"]:
            kind = "device" if process["device"] else "cpu"
            row[f"{process['process']} {kind} busy s"] = process[kind]["busy_s"]
            row[f"{process['process']} window s"] = process["window_s"]
        for shared in summary["shared_devices"]:  # over the stretch all the sharing processes' windows cover
            row |= {"shared window s": shared["window_s"], "both busy s": shared["all_busy_s"],
                    "either busy s": shared["any_busy_s"], "neither busy s": shared["none_busy_s"]}
        rows.append(row)
    return rows


def planned_runs(args, base: list[str]):
    """(name, overrides) of each run: lockstep, and each asynchronous form per staleness, correction and
    (colocated) device sharing. Every run names its mode: the default (auto) differs by machine."""
    suffix = {"is": "", "bypass": "-bypass", "none": "-uncorrected"}
    for mode in args.modes:
        if mode == "off":
            # one engine, in the trainer's process: engines_per_device (given for the colocated runs) is named unused
            yield "lockstep", [*base, "async_training.mode=off", "async_training.engines_per_device=1"]
            continue
        sharings = args.sharing if mode == "colocated" else [None]
        for staleness, correction, sharing in itertools.product(args.staleness, args.correction, sharings):
            name = f"{mode}-staleness{staleness}{suffix[correction]}"
            name += f"-{sharing}" if sharing and len(args.sharing) > 1 else ""
            overrides = [*base, f"async_training.mode={mode}", f"async_training.max_staleness={staleness}",
                         *CORRECTIONS[correction]]
            overrides += args.split_overrides if mode == "split" else []
            overrides += [f"async_training.device_sharing={sharing}"] if sharing else []  # None: the job's own
            yield name, overrides


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="a TOML job file (default: the tiny model on --data)")
    parser.add_argument("--data", help="folder with train.parquet and test.parquet (the tiny job)")
    parser.add_argument("--gsm8k", type=Path, help="(with --job) GSM8K's train.jsonl and test.jsonl: the job "
                        "trains on them, written as parquet under --work, instead of its data.train_files")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["off", "split", "colocated"])
    parser.add_argument("--staleness", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--split-overrides", nargs="*", default=["trainer.n_gpus_per_node=1",
                                                                 "async_training.rollout_n_gpus_per_node=1"])
    parser.add_argument("--correction", nargs="+", choices=sorted(CORRECTIONS), default=["is"],
                        help="the asynchronous runs' off-policy correction (one run each)")
    parser.add_argument("--sharing", nargs="+", default=[None], choices=["auto", "concurrent", "time_slicing"],
                        help="the colocated runs' async_training.device_sharing (one run each)")
    parser.add_argument("--profile", nargs="+", type=int, default=[], metavar="STEP",
                        help="trace these steps of every run with torch's profiler (profiler.steps)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    parser.add_argument("--out", help="write the table as JSON here")
    parser.add_argument("--work", help="folder for the runs and their logs (default: a new temporary folder)")
    parser.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = parser.parse_args()

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rlcore-async-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.job:
        base = [args.job]
        if args.gsm8k:
            train, test = (gsm8k_parquet(args.gsm8k, work / "data", split) for split in ("train", "test"))
            base += [f'data.train_files=["{train}"]', f'data.val_files=["{test}"]']
    else:
        if not args.data:
            parser.error("--data is needed without --job")
        from rlcore.testing import build_tiny_model

        model = build_tiny_model(work / "tiny-qwen2")
        base = [f'model.path="{model}"', f'data.train_files="{Path(args.data) / "train.parquet"}"',
                f'data.val_files="{Path(args.data) / "test.parquet"}"', *TINY_JOB]
    base += [*QUIET, f"trainer.total_training_steps={args.steps}", *args.extra]
    args.profile = traceable_steps(args.profile, args.steps)
    base += [f"profiler.steps={sorted(args.profile)}"] if args.profile else []

    from rlcore.config import load_job

    config = load_job(base[0] if args.job else None, base[1:] if args.job else base).config
    samples_per_step = config.data.train_batch_size * config.rollout.n
    table, profiles, steps, phases, by_step = {}, {}, {}, {}, {}
    for name, overrides in planned_runs(args, base):
        metrics, stopped = run(name, overrides, work, args.timeout)
        table[name] = summarize(metrics, samples_per_step, tuple(args.profile), stopped)
        steps[name] = step_times(metrics)
        phases[name] = phase_medians(metrics, tuple(args.profile))
        by_step[name] = step_phases(metrics)
        print(f"{name}: " + ", ".join(f"{k} {cell(v)}" for k, v in table[name].items()), flush=True)
        profiles[name] = profile_rows(work / name)
        if args.out:  # after each run, so that a call cut short keeps the rows it finished
            results = (table | {"step_s": steps, "timing_s": phases, "steps": by_step}
                       | ({"profiles": profiles} if args.profile else {}))
            Path(args.out).write_text(json.dumps(results, indent=2))
    labels = [label for label, _ in COLUMNS] + ["samples/s", "steps"]
    print(f"\n| run | {' | '.join(labels)} |\n|{' --- |' * (1 + len(labels))}")
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(cell(row[label]) for label in labels) + " |"
              + (f" ({row['stopped']})" if row.get("stopped") else ""))
    for name, rows in profiles.items():
        for row in rows:
            print(f"profile {name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in row.items()))
    print(f"(runs and logs in {work})")


def cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "-" if value is None else str(value)


if __name__ == "__main__":
    main()
