"""Code rewards: run a response's code against test cases in the sandbox (``rlcore.sandbox``).

The ground truth is a JSON object (text, as verl's parquet stores it, or a dict)::

    {"tests": ["assert add(1, 2) == 3", ...],   # each test case: Python run after the code
     "prelude": "from typing import List\\n...",  # optional: run before the code (HumanEval's prompt)
     "scoring": "fraction",                      # "fraction" of the tests passed, or "all" (1.0 or 0.0)
     "test_timeout_s": 3.0}                      # optional: seconds per test case

The code is the response's last fenced block (```python ... ``` or ``` ... ```), or, without one,
the whole response when it parses as Python. One sandbox run per response holds a harness (pid 1
of the sandbox's pid namespace) that forks one process per test case: the prelude, the code and
the test run there with output discarded, and the test passes only when the process reports
success through a pipe after the last line of the test ran (an ``os._exit(0)`` in the code is a
failure, not a pass). A test that does not end within its ``test_timeout_s`` is killed, with every
process it started; after ``MAX_TIMEOUTS`` such cases the remaining ones fail unrun (code that hangs
hangs on every input, and would hold a reward worker for all of them); the sandbox's own limits (CPU, memory, processes, no network, a wall clock for
the whole run) hold around all of it. Scored in a reward worker (``reward.num_workers``), so the
sandbox runs outside the trainer; ``reward.timeout_s`` must exceed the tests' total time.

The harness runs in the same process tree as the code: a program written to forge its result by
reading the harness's memory could (it cannot leave the sandbox). Rewards from model-written code
are for models that are not adversaries of their reward.
"""

from __future__ import annotations

import json
import re

from rlcore.sandbox import SandboxLimits, run_code

DATA_SOURCES = ("openai/openai_humaneval", "rlcore/code")
SCORINGS = ("fraction", "all")
DEFAULT_TEST_TIMEOUT_S = 3.0
MAX_TIMEOUTS = 2  # after this many cases ran out of time, the response's other cases fail unrun
MAX_RUN_S = 45.0  # the sandbox's wall clock for all of one response's tests: under reward.timeout_s's 60 s
_FENCED = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)

HARNESS = r'''
import json, os, signal, sys, time
PRELUDE, CODE, TESTS, TIMEOUT, MAX_TIMEOUTS = json.loads(sys.stdin.read())

def run_one(test, report):
    os.setpgid(0, 0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        scope = {"__name__": "solution"}  # not "__main__": a demo under if __name__ == "__main__" stays out
        exec(compile(PRELUDE, "prelude.py", "exec"), scope)
        exec(compile(CODE, "solution.py", "exec"), scope)
        exec(compile(test, "test.py", "exec"), scope)
        os.write(report, b"passed")
    except BaseException:
        pass
    os._exit(0)

results = []
timeouts = 0
for test in TESTS:
    if timeouts >= MAX_TIMEOUTS:  # code that hangs on every case: the rest fail unrun
        results.append(False)
        continue
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no process left to fork (the code's leftovers hold the limit)
        results.append(False)
        continue
    if pid == 0:
        os.close(read_end)
        run_one(test, write_end)
    os.close(write_end)
    deadline = time.monotonic() + TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.002)
    if not done:  # over its time: killed with the rest below
        os.kill(pid, signal.SIGKILL)
        timeouts += 1
    os.set_blocking(read_end, False)
    try:
        passed = os.read(read_end, 16) == b"passed"
    except BlockingIOError:
        passed = False
    os.close(read_end)
    results.append(passed)
    try:  # pid 1 sends to every other process of the namespace: nothing of this test outlives it
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
sys.stdout.write("\nRLCORE-RESULTS " + json.dumps(results) + "\n")
sys.stdout.flush()
os._exit(0)
'''


def extract_code(response: str) -> str | None:
    """The last fenced code block of ``response`` (a python one preferred), or the whole response
    when it is Python; None when there is no code."""
    blocks = _FENCED.findall(response)
    python = [body for language, body in blocks if language.lower() in ("python", "py", "python3")]
    if python or blocks:
        return (python or [body for _, body in blocks])[-1]
    try:
        compile(response, "response", "exec")
    except (SyntaxError, ValueError):
        return None
    return response if response.strip() else None


def parse_ground_truth(ground_truth) -> dict:
    """The ground-truth object, checked: ValueError naming what is wrong."""
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(spec, dict) or not isinstance(spec.get("tests"), list) or not spec["tests"]:
        raise ValueError("a code ground truth is a JSON object with a non-empty list 'tests' (Python test "
                         f"cases), got {str(ground_truth)[:120]!r}")
    if not all(isinstance(test, str) for test in spec["tests"]):
        raise ValueError("every entry of a code ground truth's 'tests' must be Python source text")
    scoring = spec.get("scoring", "fraction")
    if scoring not in SCORINGS:
        raise ValueError(f"a code ground truth's 'scoring' must be one of {', '.join(SCORINGS)}, got {scoring!r}")
    return spec


def run_tests(code: str, tests: list[str], prelude: str = "", test_timeout_s: float = DEFAULT_TEST_TIMEOUT_S,
              limits: SandboxLimits | None = None) -> list[bool]:
    """Whether each test passed against ``code``, run in the sandbox; all False if the run itself failed."""
    wall = min(MAX_RUN_S, test_timeout_s * len(tests) + 5.0)
    limits = limits or SandboxLimits(timeout_s=wall, cpu_seconds=max(1, int(test_timeout_s) + 1),
                                     processes=16, max_output_bytes=64 * 1024)
    result = run_code(HARNESS, limits, stdin=json.dumps([prelude, code, tests, test_timeout_s, MAX_TIMEOUTS]))
    lines = [line for line in result.stdout.splitlines() if line.startswith("RLCORE-RESULTS ")]
    if result.exit_code != 0 or not lines:
        return [False] * len(tests)
    passed = json.loads(lines[-1].removeprefix("RLCORE-RESULTS "))
    return [bool(p) for p in passed] + [False] * (len(tests) - len(passed))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict[str, float]:
    """``score``: the fraction of tests passed (or 1.0 only when all pass, ``"scoring": "all"``);
    ``acc``: 1.0 when all pass; ``tests_passed``: the fraction; ``has_code``: code was found."""
    spec = parse_ground_truth(ground_truth)
    code = extract_code(solution_str)
    if code is None:
        return {"score": 0.0, "acc": 0.0, "tests_passed": 0.0, "has_code": 0.0}
    passed = run_tests(code, spec["tests"], spec.get("prelude", ""),
                       float(spec.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S)))
    fraction = sum(passed) / len(passed)
    everything = float(all(passed))
    score = fraction if spec.get("scoring", "fraction") == "fraction" else everything
    return {"score": score, "acc": everything, "tests_passed": fraction, "has_code": 1.0}
