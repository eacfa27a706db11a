"""``benchmarks/vllm_generation.py --host-profile``: the seconds per batch in vLLM's host-side functions,
read from a real cProfile run by file and function name, and the table that shows them."""

import cProfile
import json
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import vllm_generation  # noqa: E402


def _function_in(file_name: str, name: str):
    """A function ``name(work)`` that calls ``work``, whose code says it lives in ``file_name`` (as vLLM's
    functions do, in their own files)."""
    namespace = {}
    exec(compile(f"def {name}(work):\n    return work()\n", file_name, "exec"), namespace)
    return namespace[name]


def test_host_seconds_sums_the_named_functions_per_batch():
    process_outputs = _function_in("/site/vllm/v1/engine/output_processor.py", "process_outputs")
    update = _function_in("/site/vllm/v1/engine/logprobs.py", "_update_sample_logprobs")
    unrelated = _function_in("/site/vllm/v1/engine/other.py", "process_outputs")

    def spin(n=200_000):
        return sum(range(n))

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(4):  # two batches of two steps: output processing calls the log-prob update
        process_outputs(lambda: update(spin))
        unrelated(spin)
    profile.disable()
    seconds = vllm_generation.host_seconds(profile, rounds=2)
    assert set(seconds) == set(vllm_generation.HOST_FUNCTIONS.values())
    assert seconds["output processing"] >= seconds["of which log-probs"] > 0
    assert seconds["scheduling"] == seconds["scheduler update"] == 0.0
    # the same-named function in another file is not counted: output processing is about the log-prob work
    assert seconds["output processing"] < 1.5 * seconds["of which log-probs"] + 0.01


def test_functions_of_one_name_in_one_file_count_once_when_one_calls_the_other():
    """The recording's ``collect`` (rlcore_vllm/sampler_log_probs.py) runs through vLLM's ``collective_rpc``
    into the worker's ``collect`` and on into the sampler's: the outermost's time, not their sum."""
    outer = _function_in("/repo/rlcore_vllm/sampler_log_probs.py", "collect")
    namespace = {}
    exec(compile("\n" * 40 + "def collect(work):\n    return work()\n", "/repo/rlcore_vllm/sampler_log_probs.py",
                 "exec"), namespace)
    inner = namespace["collect"]  # same file and name, another line

    def spin(n=300_000):
        return sum(range(n))

    profile = cProfile.Profile()
    profile.enable()
    outer(lambda: inner(spin))
    profile.disable()
    stats = __import__("pstats").Stats(profile).stats
    both = [cumulative for (file, _, name), (_, _, _, cumulative, _) in stats.items()
            if name == "collect" and file.endswith("sampler_log_probs.py")]
    assert len(both) == 2
    seconds = vllm_generation.host_seconds(profile, rounds=1)
    assert seconds["sampler: collect"] == round(max(both), 3) > 0


def test_the_table_shows_host_seconds_where_profiled(tmp_path):
    results = tmp_path / "gen.jsonl"
    host = {"output processing": 0.13, "of which log-probs": 0.07, "scheduling": 0.28, "scheduler update": 0.18}
    rows = [{"replicas": 1, "multiprocessing": False, "logprobs": "flat", "seconds": [25.4],
             "response_tokens": [7641], "profiled": True, "host_s": host},
            {"replicas": 1, "multiprocessing": False, "logprobs": "none", "seconds": [3.5, 3.6, 3.4],
             "response_tokens": [180000, 180000, 180000]}]
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    table = vllm_generation.table(results)
    assert "| one engine, in-process | flat | 25.40 | 301 |" in table
    assert "| one engine, in-process | none | 3.50 | 51,429 |" in table
    assert "| flat | 25.40 | 0.13 | 0.07 | 0.28 | 0.18 |" in table
    assert "| none |" not in table.split("host-side")[1]  # an unprofiled row has no host line


def test_a_mode_the_engine_refuses_is_kept_with_its_error_and_the_others_still_run(tmp_path, monkeypatch):
    """The GPU's vLLM once refused mode 'sampler' at its start; the modes after it, and the file, must not
    be lost with it."""
    from rlcore.api import RlcoreError

    monkeypatch.setattr(vllm_generation, "prompt_batches", lambda *a: ([[[1]], [[2]]], None))
    monkeypatch.setattr(vllm_generation, "start_engine", lambda *a: ("llm", "model"))
    monkeypatch.setattr(vllm_generation, "sampling_for", lambda mode, *a: mode)
    monkeypatch.setattr(vllm_generation, "timed_generate", lambda llm, batch, sampling, recorder: (2.0, 100))

    def recorder_for(mode, llm):
        if mode == "flat":
            raise RlcoreError("rollout.vllm.log_prob_source = 'sampler': not this runner")
        return None

    monkeypatch.setattr(vllm_generation, "recorder_for", recorder_for)
    results = tmp_path / "gen.jsonl"
    assert vllm_generation.main(["--gsm8k", str(tmp_path), "--results", str(results), "--rounds", "1"]) == 0
    kept = [json.loads(line) for line in results.read_text().splitlines()]
    assert [record["logprobs"] for record in kept] == list(vllm_generation.LOGPROB_MODES)
    assert kept[1] | {"date": None} == {"date": None, "replicas": 1, "multiprocessing": False, "logprobs": "flat",
                                        "error": "rollout.vllm.log_prob_source = 'sampler': not this runner"}
    table = vllm_generation.table(results)
    assert "| one engine, in-process | flat | refused: rollout.vllm.log_prob_source = 'sampler': not this runner | |" \
        in table
    assert "| one engine, in-process | none | 2.00 | 50 |" in table


def test_the_modes_asked_run_in_the_order_asked(tmp_path, monkeypatch):
    """A sitting's engine, slow to start once, was stopped after 'dicts' and 'flat' and never timed 'sampler',
    the mode the overlap rule compares against: the sitting now asks for it first."""
    monkeypatch.setattr(vllm_generation, "prompt_batches", lambda *a: ([[[1]], [[2]]], None))
    monkeypatch.setattr(vllm_generation, "start_engine", lambda *a: ("llm", "model"))
    monkeypatch.setattr(vllm_generation, "sampling_for", lambda mode, *a: mode)
    monkeypatch.setattr(vllm_generation, "timed_generate", lambda llm, batch, sampling, recorder: (2.0, 100))
    monkeypatch.setattr(vllm_generation, "recorder_for", lambda mode, llm: None)
    results = tmp_path / "gen.jsonl"
    assert vllm_generation.main(["--gsm8k", str(tmp_path), "--results", str(results), "--rounds", "1",
                                 "--modes", "sampler", "none"]) == 0
    assert [json.loads(line)["logprobs"] for line in results.read_text().splitlines()] == ["sampler", "none"]
