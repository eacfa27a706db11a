"""The multi-turn examples (GSM8K with the calculator, HumanEval with the python tool and the code
reward): ``rlcore config validate`` accepts them, on data their own preprocessors wrote, and every
data source of that data has a reward function."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlcore.config import load_job
from rlcore.config.schema import RewardConfig
from rlcore.plugins.manager import PluginManager
from rlcore.rewards.scorer import RewardScorer
from tests.conftest import SHARED, require_shared, run_rlcore
from tests.data.test_humaneval import PROBLEMS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def gsm8k_tools_data(folder: Path) -> Path:
    source = require_shared(SHARED / "data" / "gsm8k", "GSM8K")
    head = folder / "in"
    head.mkdir(parents=True)
    for split in ("train", "test"):
        with (source / f"{split}.jsonl").open() as lines:
            (head / f"{split}.jsonl").write_text("".join(next(lines) for _ in range(4)))
    result = run_rlcore("data", "gsm8k", "--tools", "calculator", "--input", str(head), "--local-save-dir",
                        str(folder / "out"))
    assert result.returncode == 0, result.stderr
    return folder / "out"


def humaneval_data(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "HumanEval.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    result = run_rlcore("data", "humaneval", "--input", str(folder / "HumanEval.jsonl"), "--test-every", "3",
                        "--local-save-dir", str(folder / "out"))
    assert result.returncode == 0, result.stderr
    return folder / "out"


@pytest.mark.parametrize("example,make_data,tools,source", [
    ("gsm8k_tools_smollm2.toml", gsm8k_tools_data, ("calculator",), "rlcore/gsm8k_tools"),
    ("humaneval_python_smollm2.toml", humaneval_data, ("python",), "openai/openai_humaneval"),
])
def test_config_validate_accepts_the_example_on_its_data(tmp_path, example, make_data, tools, source):
    path = EXAMPLES / example
    keys = run_rlcore("config", "validate", "--keys-only", str(path))
    assert keys.returncode == 0 and "OK" in keys.stdout, keys.stderr
    data = make_data(tmp_path / "data")
    # this machine has no vllm: the full check (files, folders, libraries) runs with the hf engine
    overrides = [f"data.train_files=[\"{data / 'train.parquet'}\"]", f"data.val_files=[\"{data / 'test.parquet'}\"]",
                 "rollout.name=hf"]
    full = run_rlcore("config", "validate", str(path), *overrides)
    assert full.returncode == 0 and "OK" in full.stdout, full.stdout + full.stderr
    manager = PluginManager()
    config = load_job(path, overrides, manager=manager).config
    multi_turn = config.section("rollout.multi_turn")
    assert multi_turn.enable and multi_turn.tools == tools
    assert all(name in manager.registry("tools").names() for name in tools)
    rows = [dict(row, file=str(f), row=i) for f in (data / "train.parquet", data / "test.parquet")
            for i, row in enumerate(pq.read_table(f).to_pylist())]
    assert {row["data_source"] for row in rows} == {source}
    RewardScorer(RewardConfig(), manager.registry("reward_functions")).check_sources(rows)  # raises if unknown
