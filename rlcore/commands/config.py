"""``rlcore config show|validate JOB.toml [key=value ...]``, ``rlcore config from-verl SCRIPT.sh``."""

from __future__ import annotations

import argparse
import sys

from rlcore.cli import Command


def _configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in (
        ("show", "print the fully resolved job as TOML, defaults included"),
        ("validate", "check a job file and overrides; exit 2 listing every problem"),
    ):
        p = sub.add_parser(action, help=help_text, description=help_text)
        p.add_argument("job", nargs="?", help="TOML job file (optional when everything is overridden)")
        p.add_argument("overrides", nargs="*", metavar="key.path=value", help="TOML-literal overrides")
        if action == "validate":
            p.add_argument("--keys-only", action="store_true",
                           help="check keys and values only, not files, folders or libraries (a job written for "
                                "another machine)")
    text = "turn a verl launch script (its main_ppo overrides) into an rlcore TOML job"
    p = sub.add_parser("from-verl", help=text, description=text)
    p.add_argument("script", help="a shell script that runs verl.trainer.main_ppo")
    p.add_argument("-o", "--output", help="where to write the job (default: print it)")


def split_job_and_overrides(job: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """``rlcore train a=1 b=2`` has no job file: the first positional is an override then."""
    if job is not None and "=" in job and not job.endswith(".toml"):
        return None, [job, *overrides]
    return job, list(overrides)


def report(job) -> None:
    for note in job.notes:
        print(f"note: {note}", file=sys.stderr)
    for warning in job.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    # the configuration (torch) loads when the command runs, not when ``rlcore`` starts
    from rlcore.config import load_job
    from rlcore.config.dump import to_toml

    if args.action == "from-verl":
        from rlcore.config.from_verl import from_verl

        return from_verl(args.script, args.output)
    path, overrides = split_job_and_overrides(args.job, args.overrides)
    validate = args.action == "validate"
    # the same checks as train's; --keys-only leaves out those of files, folders, disk and libraries
    job = load_job(path, overrides, check=validate, machine=validate and not args.keys_only)
    report(job)
    if args.action == "show":
        sys.stdout.write(to_toml(job.config))
    else:
        print(f"{path or 'overrides'}: OK" + (" (keys only: files, folders and libraries not checked)"
                                              if args.keys_only else ""))
    return 0


COMMAND = Command(help="show or validate a job configuration", configure=_configure, run=_run)
