"""The code reward: a response's code against test cases in the sandbox, scored in the reward pool.
Hostile responses cost their own sample and nothing else: no forged pass, nothing left running,
nothing written outside the sandbox, the scoring process untouched."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from rlcore.config.schema import RewardConfig
from rlcore.plugins.manager import PluginManager
from rlcore.rewards.code import compute_score, extract_code, parse_ground_truth, run_tests
from rlcore.rewards.scorer import RewardScorer

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (as in CI) to isolate code")

ADD_TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"],
             "prelude": "from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    \"\"\"Sum.\"\"\"\n"}
GOOD = "Here it is:\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```"
ONE_WRONG = "```python\ndef add(a, b):\n    return 0 if a == 1 else a + b\n```"  # fails add(1, 2) == 3 only


@pytest.mark.parametrize("response,code", [
    ("```python\nx = 1\n```\ntext\n```\ny = 2\n```", "x = 1\n"),  # a python block wins over a bare one
    ("```\ny = 2\n```", "y = 2\n"),
    ("```py\na = 1\n```\n```python\nb = 2\n```", "b = 2\n"),  # the last python block
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence, but Python
    ("The answer is 42.", None),
    ("", None),
])
def test_the_code_is_the_last_fenced_block_or_the_whole_python_response(response, code):
    assert extract_code(response) == code


@pytest.mark.parametrize("truth,why", [
    ("not json", "Expecting value"), ('{"tests": []}', "non-empty list 'tests'"), ("[1]", "non-empty list"),
    ('{"tests": [1]}', "Python source text"), ('{"tests": ["pass"], "scoring": "best"}', "fraction, all"),
])
def test_a_bad_ground_truth_is_named(truth, why):
    with pytest.raises(ValueError, match=why):
        parse_ground_truth(truth)


@needs_root
@pytest.mark.parametrize("scoring", ["fraction", "all"])
def test_score_is_the_fraction_of_tests_passed_or_all_pass(scoring):
    truth = json.dumps(ADD_TESTS | {"scoring": scoring})
    assert compute_score("rlcore/code", GOOD, truth) == {"score": 1.0, "acc": 1.0, "tests_passed": 1.0,
                                                         "has_code": 1.0}
    result = compute_score("rlcore/code", ONE_WRONG, truth)
    assert result["tests_passed"] == pytest.approx(2 / 3)
    assert result["score"] == pytest.approx(2 / 3 if scoring == "fraction" else 0.0)
    assert compute_score("rlcore/code", "no code here.", truth)["has_code"] == 0.0


@needs_root
def test_each_test_has_its_own_timeout():
    code = "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n"
    start = time.monotonic()
    passed = run_tests(code, ADD_TESTS["tests"], test_timeout_s=1.0)
    assert passed == [True, True, False]  # only the looping case failed, the others ran
    assert time.monotonic() - start < 6
    # code that hangs on every case: two cases run out of time, the other eight fail unrun
    start = time.monotonic()
    assert run_tests("def add(a, b):\n    while True:\n        pass\n", ["assert add(1, 1) == 2"] * 10,
                     test_timeout_s=1.0) == [False] * 10
    assert time.monotonic() - start < 5


HOSTILE = {
    "exit zero before the tests": "import os\nos._exit(0)\n",
    "sys.exit": "import sys\nsys.exit(0)\n",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory bomb": "x = bytearray(1 << 40)\n",
    "huge print": "while True:\n    print('x' * 100000)\n",
    "kill everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n",
    "forged result line": "print('\\nRLCORE-RESULTS [true, true, true]')\n",
}


@needs_root
def test_hostile_code_scores_zero_in_the_reward_pool_and_the_scorer_is_untouched(tmp_path):
    outside = tmp_path / "written_by_the_model"
    responses = [f"```python\n{code}```" for code in HOSTILE.values()]
    responses.append(f"```python\ntry:\n    open({str(outside)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
                     "def add(a, b):\n    return a + b\n```")
    responses.append(GOOD)
    config = RewardConfig(num_workers=2, timeout_s=60.0, on_error="zero")
    scorer = RewardScorer(config, PluginManager(autoload=False).registry("reward_functions"))
    before = {p.pid for p in psutil.process_iter()}
    me = psutil.Process()
    try:
        result = scorer.score(["openai/openai_humaneval"] * len(responses), responses,
                              [json.dumps(ADD_TESTS)] * len(responses))
    finally:
        scorer.close()
    # every hostile response scored 0; the one that tried to write outside its sandbox passed its tests,
    # and its file is nowhere (the sandbox's /tmp is its own)
    assert result.scores.tolist() == [0.0] * len(HOSTILE) + [1.0, 1.0]
    assert result.metrics["reward/errors"] == 0  # the reward function itself never failed
    assert not outside.exists()
    assert me.is_running() and me.status() != psutil.STATUS_ZOMBIE
    leftover = [p for p in psutil.process_iter(["pid", "uids"]) if p.info["pid"] not in before
                and p.info["uids"] and p.info["uids"].real >= 200_000]
    assert leftover == []
