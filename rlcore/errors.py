"""Exceptions for mistakes a user can fix. The CLI prints them without a traceback and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RlcoreError(Exception):
    """A user-facing error: the message says what is wrong and what to do."""


class PluginError(RlcoreError):
    """A plugin could not be loaded or registered something that clashes."""


class DuplicateNameError(PluginError):
    """Two plugins registered the same name for the same kind."""


class UnknownNameError(RlcoreError):
    """A config asked for a name that no plugin registered."""


class ConfigError(RlcoreError):
    """One or more problems in a job configuration, each with its TOML path."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"{count} problem{'s' if count != 1 else ''} in the job configuration{where}:"
        super().__init__("\n".join([header, *(f"  - {p}" for p in self.problems)]))


def close_spelling(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to a misspelled word, if one is close enough to suggest."""
    matches = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean "x"?)' or '' when nothing is close."""
    match = close_spelling(word, candidates)
    return f' (did you mean "{match}"?)' if match else ""


def describe_exit(exc: SystemExit) -> str:
    """'called sys.exit(3) at FILE:LINE' for a SystemExit raised by someone else's code, so that a
    reward function or plugin that exits is reported as that code's failure, not as the job's end."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"called sys.exit({exc.code!r}){where}"


class SharingUnavailable(RlcoreError):
    """A platform cannot run several processes' kernels side by side here; the message says why."""


def check_failed_share(failures: list[str], total: int, share: float, *, key: str, subject: str, items: str,
                       fix: str) -> None:
    """A batch's failure budget (``reward.max_failed_share``, ``rollout.agent.max_failed_share``): an
    RlcoreError naming ``key`` and the first failure when more than ``share`` of its ``total`` ``items``
    failed; ``subject`` is what failed, ``fix`` what to do about it (besides raising the share)."""
    if len(failures) > share * total:
        raise RlcoreError(f"{subject} failed on {len(failures)} of {total} {items} of this batch, more than "
                          f"{key} = {share:g}; first: {failures[0]}. {fix}, or raise {key}.")
