"""Folders that appear only when complete: ``rlcore.runtime.distributed.write_folder`` (what both training
backends write checkpoints and exports with) and the durable replacement in ``rlcore.runtime.atomic``."""

from __future__ import annotations

import os

import pytest

from rlcore.runtime.atomic import recover_directory, replace_directory, staging_dir
from rlcore.runtime.distributed import on_rank0, write_folder


def write_shard(staging):
    (staging / "shards" / "rank0").write_text("weights")


def test_a_written_folder_replaces_the_previous_one_whole(tmp_path):
    target = tmp_path / "actor"
    for version in ("one", "two"):
        write_folder(target, write_shard, lambda staging, v=version: (staging / "state.json").write_text(v),
                     subfolders=("shards",))
        assert (target / "state.json").read_text() == version
    assert sorted(os.listdir(tmp_path)) == ["actor"]
    assert (target / "shards" / "rank0").read_text() == "weights"


def test_a_failure_on_rank0_leaves_the_previous_folder_and_nothing_else(tmp_path):
    target = tmp_path / "actor"
    write_folder(target, write_shard, lambda staging: (staging / "state.json").write_text("one"),
                 subfolders=("shards",))

    def fail(staging):
        raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="simulated"):
        write_folder(target, write_shard, fail, subfolders=("shards",))
    assert sorted(os.listdir(tmp_path)) == ["actor"] and (target / "state.json").read_text() == "one"


def test_a_folder_set_aside_by_a_crash_between_the_renames_is_put_back(tmp_path):
    target = tmp_path / "actor"
    target.mkdir()
    (target / "state.json").write_text("one")
    os.replace(target, tmp_path / ".actor.old")  # what replace_directory does first; then it died
    recover_directory(target, "state.json")
    assert (target / "state.json").read_text() == "one" and not (tmp_path / ".actor.old").exists()
    recover_directory(target, "state.json")  # nothing to do the second time
    staged = staging_dir(target)
    (staged / "state.json").write_text("two")
    replace_directory(staged, target)
    assert (target / "state.json").read_text() == "two" and sorted(os.listdir(tmp_path)) == ["actor"]


def test_work_on_rank0_that_fails_raises_its_own_error():
    def fail():
        raise ValueError("bad value")

    with pytest.raises(ValueError, match="bad value"):
        on_rank0(fail, "writing")
