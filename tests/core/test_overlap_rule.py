"""benchmarks/overlap_rule.py: the one-GPU overlap rule read from a sitting's files (the bare engine's
generation, async_modes.py's runs), with the 2026-12-06 H100 figures of the 135M pair as the example."""

import json
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import overlap_rule  # noqa: E402


def write_sitting(tmp_path):
    engine = tmp_path / "gen.jsonl"
    engine.write_text("\n".join(json.dumps(record) for record in [
        {"replicas": 1, "multiprocessing": False, "logprobs": "sampler", "seconds": [3.36, 3.21]},
        {"replicas": 1, "multiprocessing": False, "logprobs": "flat", "seconds": [4.15, 3.99]},
        {"replicas": 1, "multiprocessing": True, "logprobs": "sampler", "seconds": [9.0]},
    ]) + "\n")
    pair = tmp_path / "overlap-pair.json"
    pair.write_text(json.dumps({
        "lockstep": {"s/step": 6.04, "samples/s": 84.82, "steps": 12},
        "colocated-staleness1": {"s/step": 4.70, "samples/s": 109.01, "steps": 12},
        "step_s": {"lockstep": {"1": 30.1}}, "profiles": {"lockstep": []}}))
    shared = tmp_path / "overlap-mps-half.json"  # a run of its own, no lockstep beside it
    shared.write_text(json.dumps({"colocated-staleness1": {"s/step": 3.70, "samples/s": 138.38, "steps": 12},
                                  "colocated-staleness1-cut": {"s/step": 3.60, "samples/s": 142.2, "steps": 5,
                                                               "stopped": "past its deadline"}}))
    return engine, pair, shared


def test_each_run_is_held_to_the_rule_against_the_sittings_lockstep_and_bare_engine(tmp_path, capsys):
    engine, pair, shared = write_sitting(tmp_path)
    assert overlap_rule.engine_seconds(engine, "sampler") == 3.285  # in-process, one engine, its own setting

    rows = {row["run"] + "@" + row["file"]: row
            for row in overlap_rule.verdicts([pair, shared], overlap_rule.engine_seconds(engine, "sampler"))}
    today = rows["colocated-staleness1@overlap-pair.json"]
    assert round(today["x lockstep"], 2) == 1.29 and round(today["x engine"], 2) == 1.43
    assert not today["holds"]
    concurrent = rows["colocated-staleness1@overlap-mps-half.json"]  # compared with the pair file's lockstep
    assert round(concurrent["x lockstep"], 2) == 1.63 and round(concurrent["x engine"], 3) == 1.126
    assert concurrent["holds"]
    assert rows["colocated-staleness1-cut@overlap-mps-half.json"]["stopped"] == "past its deadline"

    overlap_rule.main([str(pair), str(shared), "--engine", str(engine)])
    printed = capsys.readouterr().out
    assert "bare engine 3.29 s a batch; lockstep 6.04 s a step" in printed
    assert "| overlap-pair.json | colocated-staleness1 | 4.70 | 109.01 | 1.29 | 1.43 | not met |" in printed
    assert "| overlap-mps-half.json | colocated-staleness1 | 3.70 | 138.38 | 1.63 | 1.13 | holds |" in printed


def test_without_the_engines_file_no_run_can_hold(tmp_path):
    _, pair, _ = write_sitting(tmp_path)
    (row,) = overlap_rule.verdicts([pair], None)
    assert row["x engine"] is None and not row["holds"]
