"""``rlcore plot``: charts of metrics.jsonl, several runs overlaid."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from rlcore.cli import main
from rlcore.errors import RlcoreError
from rlcore.runs.plot import expand, plot_runs, read_run, series

pytest.importorskip("matplotlib")  # in the test extra: CI has it


def write_run(folder, scores, torn=False):
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": 0, "val-core/src/reward/mean@1": 0.25})]
    lines += [json.dumps({"step": i + 1, "critic/score/mean": s, "timing_s/step": 2.0}) for i, s in enumerate(scores)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"step": 9, "crit' if torn else ""))
    return folder


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_series_skips_missing_and_non_finite_values(tmp_path):
    run = write_run(tmp_path / "a", [0.1, None, 0.3], torn=True)
    records = read_run(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # the torn line is skipped
    assert series(records, "critic/score/mean") == ([1, 3], [0.1, 0.3])
    assert expand(("val-core/*/reward/mean@*", "critic/score/mean", "nothing"), {"a": records}) == [
        "val-core/src/reward/mean@1", "critic/score/mean"]


def test_two_runs_overlaid_as_png_and_svg(tmp_path, capsys):
    a, b = write_run(tmp_path / "exp" / "lr-1e-6", [0.1, 0.2]), write_run(tmp_path / "exp" / "lr-1e-5", [0.3, 0.6])
    out = tmp_path / "charts"
    assert main(["plot", str(a), str(b), "--metrics", "critic/score/mean", "val-core/*", "--out", str(out),
                 "--svg"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["critic_score_mean.png", "critic_score_mean.svg", "val-core_src_reward_mean_at_1.png",
                     "val-core_src_reward_mean_at_1.svg"]
    assert png_size(out / "critic_score_mean.png") == (600, 350)
    svg = (out / "critic_score_mean.svg").read_text()
    # matplotlib writes each text as a comment: the title and a legend entry per run
    assert "<!-- critic/score/mean -->" in svg and "<!-- lr-1e-6 -->" in svg and "<!-- lr-1e-5 -->" in svg
    assert capsys.readouterr().out.splitlines()[0] == str(out / "critic_score_mean.png")


def test_unknown_metrics_and_missing_runs_are_errors(tmp_path, capsys):
    run = write_run(tmp_path / "a", [0.1])
    with pytest.raises(RlcoreError, match="none of the metrics nope"):
        plot_runs([run], tmp_path / "out", ("nope",))
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_without_matplotlib_the_error_says_what_to_install(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "a", [0.1])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["plot", str(run)]) == 2
    assert "pip install 'rlcore[plot]'" in capsys.readouterr().err
