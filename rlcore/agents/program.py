"""External agent programs (``rollout.agent.command``): one process per episode, started with the
episode's endpoint address and key in its environment, ended when it exits.

The process gets, besides the job's environment:

- ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``: the endpoint and this episode's key (the ``openai``
  package reads both by itself);
- ``RLCORE_EPISODE``: the path of a JSON file holding the episode (``prompt``, the chat messages;
  ``ground_truth``, ``extra_info``, ``data_source``, ``sample``);
- ``RLCORE_RESULT``: a path it may write a JSON object to before it exits: ``{"answer": "..."}`` (scored
  by the job's reward function) or ``{"reward": 1.0}`` (used as is). Without the file, the text of the
  episode's last call is scored.

Each process runs in a process group of its own, so that ending it ends whatever it started: an exit
code other than 0 fails the episode (``ProgramFailed``, with the tail of its output, stdout and stderr
together); a process still running when its episode is cancelled (``rollout.agent.timeout_s``, a stop
of the job) gets SIGTERM, then SIGKILL after ``KILL_GRACE_S``. What the group leaves behind after the
program exits is ended the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import tempfile
from pathlib import Path

from rlcore.agents import AgentResult, Episode

KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
OUTPUT_TAIL = 4000  # bytes of a program's output kept for the error of a failed episode


class ProgramFailed(Exception):
    """The program could not start or wrote a result that is no answer or reward (``status = "error"``),
    or exited with a status other than 0 (``"exit"``)."""

    def __init__(self, message: str, status: str = "error"):
        super().__init__(message)
        self.status = status


class AgentProgram:
    """Runs ``argv`` once per episode (``run``, an ``Agent``'s function); ``kill_all`` ends every process
    group still alive, from synchronous code (the rollout's ``finally``)."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.groups: set[int] = set()  # the process groups of running programs

    async def run(self, episode: Episode, client=None) -> AgentResult:
        folder = Path(tempfile.mkdtemp(prefix="rlcore-episode-"))
        try:
            (folder / "episode.json").write_text(json.dumps(episode_record(episode), default=_plain),
                                                 encoding="utf-8")
            env = os.environ | {"OPENAI_BASE_URL": episode.base_url, "OPENAI_API_KEY": episode.api_key,
                                "RLCORE_EPISODE": str(folder / "episode.json"),
                                "RLCORE_RESULT": str(folder / "result.json")}
            try:
                process = await asyncio.create_subprocess_exec(
                    *self.argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise ProgramFailed(f"rollout.agent.command = {self.argv!r} could not start: {exc}") from None
            self.groups.add(process.pid)
            tail = bytearray()
            reader = asyncio.create_task(_keep_tail(process.stdout, tail))
            try:
                code = await process.wait()
            finally:
                try:
                    await end_group(process)  # what it left behind too (which may hold its output open)
                    self.groups.discard(process.pid)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader, KILL_GRACE_S)
                finally:
                    reader.cancel()
                    close_transport(process)
            if code != 0:
                why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
                output = tail.decode("utf-8", errors="replace").strip()
                raise ProgramFailed(f"the agent program {why}" + (f"; its output ends: {output}" if output else
                                                                   " (no output)"), status="exit")
            return read_result(folder / "result.json")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def kill_all(self) -> None:
        """SIGKILL every process group still alive (a rollout cut short before its episodes' clean-up ran)."""
        for group in list(self.groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            self.groups.discard(group)


def episode_record(episode: Episode) -> dict:
    """The ``RLCORE_EPISODE`` file's content: the dataset row the program works on."""
    return {"prompt": episode.prompt, "ground_truth": episode.ground_truth, "extra_info": episode.extra_info,
            "data_source": episode.data_source, "sample": episode.sample}


def read_result(path: Path) -> AgentResult:
    """What the program wrote to ``RLCORE_RESULT``: its answer, its reward, or None (no file)."""
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        result = None
    expected = 'expected {"answer": "<text>"} or {"reward": <number>}'
    if not isinstance(result, dict) or len(result.keys() & {"answer", "reward"}) != 1:
        raise ProgramFailed(f"the agent program wrote {text[:200]!r} to RLCORE_RESULT: {expected}")
    if "answer" in result:
        if not isinstance(result["answer"], str):
            raise ProgramFailed(f"RLCORE_RESULT's answer is {result['answer']!r}: {expected}")
        return result["answer"]
    reward = result["reward"]
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ProgramFailed(f"RLCORE_RESULT's reward is {reward!r}: {expected} (a finite number)")
    return float(reward)


async def end_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the process's group; SIGKILL to what is left of it after ``KILL_GRACE_S``."""
    group = process.pid
    try:
        os.killpg(group, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return  # the program exited and left nothing behind
    loop = asyncio.get_running_loop()
    deadline = loop.time() + KILL_GRACE_S
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    while loop.time() < deadline and _group_alive(group):
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)


def close_transport(process: asyncio.subprocess.Process) -> None:
    """Close the process's pipes now, in the running loop. Left open (its output not read to the end: the
    reader cut short), asyncio's transport closes them when it is garbage-collected, which may be after
    the loop has closed: its ``__del__`` then raises, and formatting that unraisable error (Python 3.11
    parses source lines with ``ast`` to point at the failing expression) inside another ``ast.parse``,
    where the collection happened to run, breaks that parse (``SystemError: AST constructor recursion
    depth mismatch``). asyncio's ``Process`` has no public close; its transport is ``_transport``."""
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _keep_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read ``stream`` to its end (a program blocks on a full pipe), keeping its last ``OUTPUT_TAIL`` bytes."""
    while chunk := await stream.read(65536):
        tail += chunk
        del tail[:-OUTPUT_TAIL]


def _plain(value):
    """JSON for the dataset's numpy values (a parquet column's arrays and scalars)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
