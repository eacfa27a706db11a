"""External agent programs (``rollout.agent.command``) and the limits of an episode, through real HTTP in
front of the real ``hf`` engine on tiny models: a program written with the ``openai`` package runs
episodes of several calls whose rows hold the engine's very tokens; an agent that raises, hangs or exits
non-zero ends its episode with a named reason and a count; the failure budget stops the job; the token
limit refuses; a stop of the job mid-episode leaves no process and no endpoint behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import attrs
import psutil
import pytest

from rlcore.agents import Agent
from rlcore.agents.rollout import AgentRollout
from rlcore.errors import RlcoreError
from rlcore.models.loading import load_tokenizer
from rlcore.training.roles import SamplingParams
from tests.agents.conftest import ANSWER, RESPONSE_LENGTH, prompt_batch
from tests.agents.test_endpoint import real, reference_log_probs

openai = pytest.importorskip("openai", reason="the agent programs are written with the openai package")

REPO = Path(__file__).resolve().parents[2]
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE_LENGTH, seed=7)

# Three calls that append to the conversation; the texts it received come back as its answer.
APPENDING = '''
import json, os
from openai import OpenAI

episode = json.load(open(os.environ["RLCORE_EPISODE"]))
assert episode["ground_truth"] == "12321" and episode["data_source"] == "test", episode
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages, texts = list(episode["prompt"]), []
for turn in range(3):
    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    texts.append(reply.choices[0].message.content)
    messages += [{"role": "assistant", "content": texts[-1]}, {"role": "user", "content": f"go on {turn}"}]
json.dump({"answer": json.dumps([episode["sample"], texts])}, open(os.environ["RLCORE_RESULT"], "w"))
'''

# By sample: 0 exits 1 with a message; 1 reports a reward; 2 starts a child and hangs; 3 writes a bad result.
MISBEHAVING = '''
import json, os, subprocess, sys, time

episode = json.load(open(os.environ["RLCORE_EPISODE"]))
sample = episode["sample"]
if sample == 0:
    print("cannot parse the plan", file=sys.stderr)
    sys.exit(1)
if sample == 1:
    json.dump({"reward": 0.25}, open(os.environ["RLCORE_RESULT"], "w"))
if sample == 2:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(os.path.join(sys.argv[1], f"{os.getpid()}.pids"), "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(120)
if sample == 3:
    open(os.environ["RLCORE_RESULT"], "w").write("not json")
'''


def program(folder: Path, text: str, *args: str) -> tuple[str, ...]:
    path = folder / "agent.py"
    path.write_text(text)
    return (sys.executable, str(path), *args)


def run(engine, questions, sampling=SAMPLING, agent=None, echo=None, **section):
    """A rollout of ``questions`` by ``agent`` (a plugin's function) or, without it, ``section["command"]``."""
    config = engine.config
    settings = attrs.evolve(config.section("rollout.agent"), **({"name": None} if agent is None else {}) | section)
    tokenizer = load_tokenizer(config.model.path)
    rollout = AgentRollout(settings, None if agent is None else Agent(agent), tokenizer, config,
                           echo=print if echo is None else echo)
    try:
        return rollout.generate(prompt_batch(tokenizer, questions), sampling, engine.generate, "1"), tokenizer
    finally:
        rollout.close()


def group_members(group: int) -> list[int]:
    """The running processes of process group ``group``. A zombie awaiting its parent's wait is left out:
    ``os.killpg(group, 0)`` still succeeds for a group of zombies, which a loaded machine may not have
    reaped yet (a CI run failed on that)."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.info["pid"]) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process.info["pid"])
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def gone(pids: list[int]) -> bool:
    """No process of ``pids`` is still running (a zombie awaiting its parent's wait counts as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def test_a_program_written_with_openai_runs_episodes_of_several_calls(tiny_engine, tmp_path):
    """Three calls per episode from a program of its own: one row per episode, trained on exactly the
    tokens the engine generated (as recorded and as the program received them), with the engine's
    log-probs; the answer the program wrote back is the episode's."""
    command = program(tmp_path, APPENDING)
    batch, tokenizer = run(tiny_engine, ["What is 3 + 4?"], command=command, record_dir=str(tmp_path / "rec"))
    metrics = batch.meta["agent_metrics"]
    assert metrics["agent/episodes"] == metrics["agent/rows"] == 2 and metrics["agent/calls/min"] == 3, metrics
    assert metrics["agent/errors"] == metrics["agent/exit_failures"] == metrics["agent/non_extending_episodes"] == 0
    records = [json.loads(line) for line in (tmp_path / "rec" / "1.jsonl").read_text().splitlines()]
    for row, record in enumerate(records):
        assert record["status"] == "ok" and record["extending"]
        sample, texts = json.loads(batch["response"][row])
        assert sample == row
        outputs = [call["output_ids"] for call in record["calls"]]
        assert [len(ids) for ids in outputs] == [6, 6, 6]
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in outputs] == texts
        prompt, response, mask, log_probs = real(batch, row)
        assert prompt == record["calls"][0]["prompt_ids"]
        assert [t for t, m in zip(response, mask) if m] == [t for ids in outputs for t in ids]
        assert sum(mask) == 18 and [lp for lp, m in zip(log_probs, mask) if m] == \
            [lp for call in record["calls"] for lp in call["log_probs"]]
        expected = reference_log_probs(tiny_engine.config.model.path, prompt, response)
        assert [e for e, m in zip(expected, mask) if m] == pytest.approx([lp for lp, m in zip(log_probs, mask) if m],
                                                                          abs=1e-4)


def test_the_example_calculator_program_calls_the_tool_and_answers(tool_engine):
    """examples/agents/calculator_agent.py against the policy that calls the calculator: it evaluates
    111*111, sends 12321 back and answers; the row trains the call and the answer, not the tool's reply."""
    command = (sys.executable, str(REPO / "examples" / "agents" / "calculator_agent.py"))
    batch, tokenizer = run(tool_engine, ["What is 111 * 111?"], sampling=SamplingParams(n=1, seed=3), command=command)
    assert batch["response"] == [ANSWER] and batch.meta["agent_metrics"]["agent/calls/max"] == 2
    _, response, mask, _ = real(batch, 0)
    assert tokenizer.decode([t for t, m in zip(response, mask) if not m]) == \
        "\n<|im_start|>tool\n12321<|im_end|>\n<|im_start|>assistant\n"


def test_failing_programs_end_their_episodes_with_a_reason_and_a_count(tiny_engine, tmp_path):
    """Exit 1 (its output's tail in the reason), a reward written back, a hang past timeout_s (the
    process and its child killed), a result that is not JSON: each episode ends, counted by reason."""
    lines = []
    command = program(tmp_path, MISBEHAVING, str(tmp_path))
    started = time.monotonic()
    batch, _ = run(tiny_engine, ["q"], sampling=SamplingParams(n=4, seed=1), command=command, timeout_s=2.0,
                   max_failed_share=1.0, echo=lines.append)
    assert time.monotonic() - started < 20
    metrics = batch.meta["agent_metrics"]
    assert (metrics["agent/exit_failures"], metrics["agent/timeouts"], metrics["agent/errors"],
            metrics["agent/returned_reward"]) == (1, 1, 1, 1), metrics
    assert batch["agent_reward"] == [0.0, 0.25, 0.0, 0.0]
    assert "3 of 4 episodes failed" in lines[-1]
    assert "the agent program exited with status 1; its output ends: cannot parse the plan" in lines[-1]
    [pids] = [f.read_text().split() for f in tmp_path.glob("*.pids")]
    assert gone([int(p) for p in pids])


def test_an_agent_that_raises_or_hangs_ends_its_episode(tiny_engine):
    """A plugin agent that raises (agent/errors, its exception named) and one that hangs past timeout_s
    (agent/timeouts); the others' episodes are scored as usual."""
    lines = []

    async def agent(episode, client):
        import asyncio

        if episode.extra_info["index"] == 0:
            if episode.sample == 0:
                raise ValueError("no plan")
            await asyncio.sleep(60)
        reply = await client.chat.completions.create(model="m", messages=episode.prompt, max_tokens=2)
        return reply.choices[0].message.content

    batch, _ = run(tiny_engine, ["q0", "q1"], agent=agent, timeout_s=1.5, echo=lines.append)
    metrics = batch.meta["agent_metrics"]
    assert (metrics["agent/errors"], metrics["agent/timeouts"], metrics["agent/exit_failures"]) == (1, 1, 0), metrics
    assert batch["agent_reward"][:2] == [0.0, 0.0] and all(r != r for r in batch["agent_reward"][2:])  # NaN: scored
    assert "2 of 4 episodes failed (scored 0); the first: ValueError: no plan" in lines[-1]


def test_more_failed_episodes_than_the_budget_stop_the_job(tiny_engine, tmp_path):
    """Every episode's program exits 1: more than rollout.agent.max_failed_share, the job stops naming
    the setting and the first reason."""
    command = (sys.executable, "-c", "import sys; print('no model today'); sys.exit(1)")
    with pytest.raises(RlcoreError, match=r"failed on 2 of 2 episodes of this batch, more than rollout\.agent\."
                                          r"max_failed_share = 0\.5; first: the agent program exited with status 1; "
                                          r"its output ends: no model today\. Fix the agent"):
        run(tiny_engine, ["q"], command=command, record_dir=str(tmp_path))
    assert [json.loads(line)["status"] for line in (tmp_path / "1.jsonl").read_text().splitlines()] == ["exit"] * 2


def test_the_token_limit_of_an_episode_cuts_then_refuses(tiny_engine):
    """rollout.agent.max_tokens = 10: a first call of 8 tokens, a second cut to the 2 left, a third
    refused with an OpenAI-style error (code episode_token_limit) that the agent can read."""
    seen = {}

    async def agent(episode, client):
        messages, counts = list(episode.prompt), []
        for _ in range(2):
            reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
            counts.append((reply.usage.completion_tokens, reply.choices[0].finish_reason))
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "more"}]
        try:
            await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        except openai.BadRequestError as error:
            counts.append((error.status_code, error.code, "rollout.agent.max_tokens = 10" in error.message))
        seen[episode.sample] = counts
        return None

    batch, _ = run(tiny_engine, ["q"], agent=agent, max_tokens=10)
    assert seen == {s: [(8, "length"), (2, "length"), (400, "episode_token_limit", True)] for s in (0, 1)}
    assert batch.meta["agent_metrics"]["agent/refused_requests"] == 2
    assert [sum(real(batch, row)[2]) for row in range(2)] == [10, 10]


def test_a_stop_of_the_job_mid_episode_leaves_no_process_and_no_endpoint(tiny_engine, tmp_path):
    """SIGTERM while every episode's program (and the child it started) runs: the job's stop handler
    raises, the episodes are cancelled, their process groups killed, and the endpoint's port closes."""
    from rlcore.runtime.stopping import Stopped, stop_on_signals

    command = program(tmp_path, MISBEHAVING, str(tmp_path))
    config = tiny_engine.config
    settings = attrs.evolve(config.section("rollout.agent"), name=None, command=command)
    tokenizer = load_tokenizer(config.model.path)
    rollout = AgentRollout(settings, None, tokenizer, config)
    sampling = SamplingParams(n=3, seed=1)  # sample 2 of each prompt hangs

    lock, finished = threading.Lock(), []

    def stop_when_running():
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*.pids"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        with lock:  # never after the stop handler is gone: the default one would end pytest
            if not finished:
                os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_when_running, daemon=True)
    try:
        with pytest.raises(Stopped), stop_on_signals(echo=lambda line: None):
            stopper.start()
            try:
                rollout.generate(prompt_batch(tokenizer, ["q0", "q1"]), sampling, tiny_engine.generate, "1")
            finally:
                with lock:
                    finished.append(True)
    finally:
        port = rollout.endpoint.port
        rollout.close()  # what the trainer's finally does
        stopper.join(timeout=30)
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    assert len(pids) == 4 and gone(pids)
    for leader in pids[::2]:
        assert group_members(leader) == []  # no process of its group remains (zombies not yet reaped aside)
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))



def test_a_cancelled_episode_leaves_no_pipe_to_the_garbage_collector(tmp_path, monkeypatch):
    """An episode cancelled while its program runs (its time limit, a stop), the kill's grace cut to 0 so
    that its output is not read to the end: no error reaches the garbage collector afterwards. A CI run
    ended in ``SystemError: AST constructor recursion depth mismatch`` right after an asyncio subprocess
    transport raised in ``__del__`` ("Event loop is closed": pipes closed only when collected, after
    their loop had closed; formatting that error runs ``ast.parse`` inside whatever ``ast.parse`` the
    collection interrupted). The episode now closes its program's pipes in its own loop
    (``close_transport``). This test did not reproduce that run's failure on an idle machine: it guards
    the path, the timing was CI's."""
    import asyncio
    import gc

    from rlcore.agents import Episode
    from rlcore.agents import program as programs

    monkeypatch.setattr(programs, "KILL_GRACE_S", 0.0)
    hanging = program(tmp_path, "import time\nprint('working', flush=True)\ntime.sleep(60)\n")
    episode = Episode(prompt=[{"role": "user", "content": "q"}], ground_truth="1", extra_info={},
                      data_source="test", base_url="http://127.0.0.1:9/v1", api_key="k")
    gc.collect()  # what earlier tests left for the collector is theirs, not this episode's
    unraisable = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(programs.AgentProgram(list(hanging)).run(episode), 1.0))
        gc.collect()
    finally:
        sys.unraisablehook = previous_hook
    assert [f"{record.exc_type.__name__}: {record.exc_value}" for record in unraisable] == []
