"""Learning runs of the GSM8K job, greedy validation on the whole test set along the way: rlcore in
lockstep, rlcore in its default one-GPU form (and the colocated form with its two cheaper corrections,
``rlcore-colocated-bypass`` and ``rlcore-colocated-uncorrected``), and verl 0.9.1, each in its own process,
one results file for the sitting. One mechanism for two comparisons: the asynchronous default against lockstep (the
one-GPU issue: reward at the last step no lower than lockstep's minus 0.01) and rlcore against verl
(the verl issue: reward no lower than verl's minus 0.01, format rate no lower than verl's minus 2 points).

The job is ``examples/gsm8k_grpo_smollm2.toml`` (SmolLM2-135M-Instruct, 64 prompts x 8, <= 512 new
tokens, KL loss) with ``reward.format_score=0.1 actor.optim.lr=3e-6``, validation before training and
every ``--every`` steps, the same prompt order in every run (``data.seed``: rlcore's shuffle is
``torch.randperm`` of a generator seeded with it, as verl's ``RandomSampler`` with ``data.seed``; checked
in tests/core/test_learning_runs.py). verl runs job ``a`` in its own keys (``verl_jobs.job_a_verl``) with
the same changes, scored by ``verl_rewards/gsm8k_format.py``: verl's own GSM8K scorer with format score 0.1,
and the accuracy and format extras rlcore's GSM8K reward reports.

Run (the GPU machine; verl's environment ``envs/verl-0.9.1.txt`` for ``verl``)::

    python benchmarks/learning_runs.py run rlcore-lockstep rlcore-default --gsm8k DIR --work WORK --results learn.jsonl
    python benchmarks/learning_runs.py run verl --gsm8k DIR --work WORK --results learn.jsonl
    # the same cut for every system, after "--" (verl's keys, which rlcore takes too):
    python benchmarks/learning_runs.py run verl rlcore-default --gsm8k DIR --work WORK --results learn.jsonl -- \
        data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16
    python benchmarks/learning_runs.py table learn.jsonl

A run past ``--timeout`` is stopped; it checkpoints at every validation step in ``WORK/<system>``, so the
same command again (a later call to the still-warm machine) resumes it from there, each call a record of
its own; ``table`` puts a system's records together, step by step. A run that already reached its last
step is not started again.

Each validation row gives reward (the mean score), accuracy (right answers) and format rate (a
``#### number`` present), from each system's own validation metrics (``<val-core|val-aux>/openai/gsm8k/
{reward,acc,format}/mean@1``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sitting import CORRECTIONS, EXAMPLE

HERE = Path(__file__).resolve().parent
VERL_REWARD = HERE / "verl_rewards" / "gsm8k_format.py"
# rlcore-<form>: lockstep; the example's default (on one GPU: colocated, rollout IS); and the colocated
# form's two cheaper corrections, the one-GPU issue's levers (bypass: the engine's log-probs as the old
# policy's; uncorrected: no rollout log-probs at all), to learn whether either may become the default
FORMS = {"lockstep": ["async_training.mode=off"], "default": [],
         "colocated-bypass": ["async_training.mode=colocated", *CORRECTIONS["bypass"]],
         "colocated-uncorrected": ["async_training.mode=colocated", *CORRECTIONS["none"]]}
SYSTEMS = (*(f"rlcore-{form}" for form in FORMS), "verl")
SOURCE = "openai/gsm8k"
VALUES = {"reward": "reward", "accuracy": "acc", "format rate": "format"}
SEED = 1


def rlcore_overrides(train: Path, val: Path, steps: int, every: int, form: str) -> list[str]:
    """The example job as the learning run: the issue's two changes, validation at 0 and every ``every``
    steps on ``val`` (a checkpoint there too, to resume from), in ``form`` (``FORMS``)."""
    overrides = [str(EXAMPLE), f"data.train_files=['{train}']", f"data.val_files=['{val}']",
                 "reward.format_score=0.1", "actor.optim.lr=3e-6", f"trainer.total_training_steps={steps}",
                 "trainer.val_before_train=true", f"trainer.test_freq={every}", f"data.seed={SEED}",
                 "rollout.val.do_sample=false", f"trainer.save_freq={every}", "trainer.resume_mode=auto"]
    return overrides + FORMS[form]


def verl_overrides(model: Path, train: Path, val: Path, steps: int, every: int) -> list[str]:
    """Job ``a`` in verl's keys with the same changes, greedy validation (verl's val_kwargs default), in verl's
    fastest one-GPU form on an image without flash-attn (padded rows: 71 s a step against 129 s packed, under
    sdpa, docs/benchmarks.md 2026-12-02) with half the token budgets, so that the actor (58.8 GB at the
    example's budgets) and vLLM fit an 80 GB card too; the micro-batches change the arithmetic's order, not
    the update."""
    from verl_jobs import job_a_verl, with_overrides

    return with_overrides(job_a_verl(model, train, val, steps), [
        "actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768",
        "actor_rollout_ref.actor.optim.lr=3e-6", "trainer.val_before_train=True", f"trainer.test_freq={every}",
        f"trainer.save_freq={every}", "trainer.resume_mode=auto",
        f"data.seed={SEED}", "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        f"reward.custom_reward_function.path={VERL_REWARD}", "reward.custom_reward_function.name=compute_score"])


def validations(metrics: list[dict]) -> list[dict]:
    """Each validation in ``metrics`` (rlcore's metrics.jsonl rows or verl's file-logger rows, ``step`` in
    each): ``{"step", "reward", "accuracy", "format rate"}``. A value may sit under val-core or val-aux (verl
    and rlcore file them differently)."""
    rows = []
    for record in metrics:
        found = {}
        for label, name in VALUES.items():
            for group in ("val-core", "val-aux"):
                key = f"{group}/{SOURCE}/{name}/mean@1"
                if key in record:
                    found[label] = float(record[key])
        if "reward" in found:
            rows.append({"step": int(record["step"]), **found})
    return rows


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_system(system: str, gsm8k: Path, work: Path, steps: int, every: int, timeout_s: int,
               extra: list[str]) -> dict:
    """One call of a learning run in a process of its own, in ``work/<system>`` (resumed from its last
    checkpoint there); the validations this call logged, or what it managed before its deadline."""
    from sitting import GpuMemoryPeak, RanPastDeadline, gsm8k_parquet, run_bounded

    data, run_dir = work / "data", work / system
    train = data / "train.parquet" if (data / "train.parquet").is_file() else gsm8k_parquet(gsm8k, data)
    val = data / "test.parquet" if (data / "test.parquet").is_file() else gsm8k_parquet(gsm8k, data, "test")
    call = len(list(run_dir.glob("call-*.log"))) + 1 if run_dir.is_dir() else 1
    stopped = None
    if system == "verl":
        import verl_jobs

        from rlcore.models.loading import resolve_model_path

        model = Path(resolve_model_path("embedded:smollm2-135m-instruct"))
        overrides = verl_jobs.with_overrides(verl_overrides(model, train, val, steps, every), extra)
        record = verl_jobs.run_verl(overrides, "a", run_dir, timeout_s, GpuMemoryPeak(),
                                    metrics_name=f"verl_metrics.{call}.jsonl")
        metrics_file = run_dir / f"verl_metrics.{call}.jsonl"
        rows = verl_jobs.read_file_logger(metrics_file) if metrics_file.is_file() else []
        command, stopped = record["overrides"], record.get("stopped")
    else:
        command = [sys.executable, "-m", "rlcore", "train",
                   *rlcore_overrides(train, val, steps, every, system.removeprefix("rlcore-")),
                   f"trainer.default_local_dir={run_dir}", *extra]
        print("$", " ".join(command), flush=True)
        before = len(_read_jsonl(run_dir / "metrics.jsonl")) if (run_dir / "metrics.jsonl").is_file() else 0
        try:
            run_bounded(command, timeout_s)
        except RanPastDeadline as deadline:
            print(deadline, flush=True)
            stopped = f"killed at {timeout_s} s"
        metrics_file = run_dir / "metrics.jsonl"  # rlcore appends to it when it resumes
        rows = _read_jsonl(metrics_file)[before:] if metrics_file.is_file() else []
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"call-{call}.log").write_text(" ".join(map(str, command)) + "\n")
    return {"system": system, "call": call, "validations": validations(rows), "overrides": command,
            "last_step": max((int(row["step"]) for row in rows), default=None),
            **({"stopped": stopped} if stopped else {})}


def finished(work: Path, system: str, steps: int) -> bool:
    """Whether the run in ``work/<system>`` already validated at its last step (every call's logs read)."""
    run_dir = work / system
    files = [run_dir / "metrics.jsonl", *run_dir.glob("verl_metrics.*.jsonl")] if run_dir.is_dir() else []
    for file in files:
        if file.is_file():
            rows = verl_rows(file) if file.name.startswith("verl_") else _read_jsonl(file)
            if any(row["step"] == steps for row in validations(rows)):
                return True
    return False


def verl_rows(path: Path) -> list[dict]:
    from verl_jobs import read_file_logger

    return read_file_logger(path)


def merged(records: list[dict]) -> dict[str, list[dict]]:
    """Each system's validations over all its calls, by step (a later call's value for a step wins)."""
    by_system: dict[str, dict[int, dict]] = {}
    for record in records:
        steps = by_system.setdefault(record["system"], {})
        for row in record["validations"]:
            steps[row["step"]] = row
    return {system: [steps[step] for step in sorted(steps)] for system, steps in by_system.items()}


def table(records: list[dict]) -> str:
    """The learning table (markdown), then the two comparisons at the last step all systems reached."""
    lines = ["| system | step | reward | accuracy | format rate |", "|---|---|---|---|---|"]
    last: dict[str, dict] = {}
    for system, rows in merged(records).items():
        for row in rows:
            lines.append(f"| {system} | {row['step']} | {row['reward']:.4f} | "
                         f"{row.get('accuracy', float('nan')):.4f} | {row.get('format rate', float('nan')):.4f} |")
        if rows:
            last[system] = rows[-1]
    failed = {record["system"]: record["failed"] for record in records if "failed" in record}
    lines += [f"| {system} | failed: {failure} | | | |" for system, failure in failed.items()
              if system not in last]
    lines.append("")
    comparisons = [(f"rlcore-{form}", "rlcore-lockstep", "reward >= lockstep's - 0.01")
                   for form in FORMS if form != "lockstep"]
    comparisons += [(ours, "verl", "reward >= verl's - 0.01, format >= verl's - 0.02")
                    for ours in ("rlcore-lockstep", "rlcore-default")]
    for ours, theirs, rule in comparisons:
        if ours in last and theirs in last:
            a, b = last[ours], last[theirs]
            holds = a["reward"] >= b["reward"] - 0.01 and (
                theirs != "verl" or a.get("format rate", 0.0) >= b.get("format rate", 0.0) - 0.02)
            lines.append(f"{ours} (step {a['step']}) vs {theirs} (step {b['step']}): reward {a['reward']:.4f} vs "
                         f"{b['reward']:.4f}, format rate {a.get('format rate', float('nan')):.4f} vs "
                         f"{b.get('format rate', float('nan')):.4f}: {rule}: {'holds' if holds else 'does not hold'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="learning runs, appended to --results")
    run.add_argument("systems", nargs="+", choices=SYSTEMS)
    run.add_argument("--gsm8k", type=Path, required=True, help="a folder with GSM8K's train.jsonl and test.jsonl")
    run.add_argument("--results", type=Path, required=True)
    run.add_argument("--work", type=Path, required=True, help="where the runs keep their data, checkpoints and logs")
    run.add_argument("--steps", type=int, default=30)
    run.add_argument("--every", type=int, default=10, help="validate every this many steps (and before step 1)")
    run.add_argument("--timeout", type=int, default=580, help="seconds one run may take")
    show = commands.add_parser("table", help="the learning table of a results file")
    show.add_argument("results", type=Path)
    argv = sys.argv[1:] if argv is None else list(argv)
    # after "--": more overrides, for every system given (verl's keys reach rlcore too)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "table":
        print(table(_read_jsonl(args.results)))
        return 0
    sys.path.insert(0, str(HERE))
    for system in args.systems:
        if finished(args.work, system, args.steps):
            print(f"{system}: already validated at step {args.steps} in {args.work / system}", flush=True)
            continue
        try:
            record = run_system(system, args.gsm8k, args.work, args.steps, args.every, args.timeout, overrides)
        except SystemExit as failure:  # one system that cannot run leaves the sitting to the others
            print(f"{system}: {failure}", flush=True)
            record = {"system": system, "validations": [], "failed": str(failure)}
        with args.results.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(json.dumps(record["validations"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
