import json

import pytest

from rlcore.errors import RlcoreError
from rlcore.runs.checkpoint import LATEST, CheckpointManager, read_state, resolve_resume


def save(manager, step, **state):
    staging = manager.begin(step)
    (staging / "actor").mkdir()
    return manager.commit(staging, step, state)


def test_commit_publishes_and_points_latest(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1, loader={"position": 4})
    save(manager, 2, loader={"position": 8})
    assert manager.latest() == tmp_path / "global_step_2"
    assert (tmp_path / LATEST).read_text() == "2"
    assert read_state(manager.latest()) == {"global_step": 2, "loader": {"position": 8}}


def test_an_unfinished_save_is_invisible_and_cleaned_by_the_next_lock_holder(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    crashed = manager.begin(2)  # a save that dies before commit (e.g. SIGKILL)
    (crashed / "actor").mkdir()
    assert manager.latest() == tmp_path / "global_step_1"
    assert resolve_resume(tmp_path, "auto") == tmp_path / "global_step_1"
    save(manager, 2)
    assert crashed.is_dir()  # saving never deletes a staging folder: it could be another writer's
    CheckpointManager(tmp_path).remove_leftovers()  # what the next job does once it holds the folder's lock
    assert not list(tmp_path.glob(".global_step_*"))


def test_a_stale_latest_marker_falls_back_to_the_newest_complete(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    (tmp_path / LATEST).write_text("7")
    assert manager.latest() == tmp_path / "global_step_1"


def test_keeps_at_most_max_to_keep(tmp_path):
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        save(manager, step)
    assert manager.steps() == [2, 3]


def test_resume_modes(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert resolve_resume(tmp_path, "auto") is None
    save(manager, 3)
    assert resolve_resume(tmp_path, "disable") is None
    assert resolve_resume(tmp_path, str(tmp_path / "global_step_3")) == tmp_path / "global_step_3"
    with pytest.raises(RlcoreError, match="trainer.resume_mode = .*not a checkpoint folder"):
        resolve_resume(tmp_path, str(tmp_path / "nope"))
    assert json.loads((tmp_path / "global_step_3" / "trainer_state.json").read_text())["global_step"] == 3


def test_verls_resume_path_mode_takes_the_folder_from_resume_from_path(tmp_path):
    save(CheckpointManager(tmp_path), 4)
    assert resolve_resume(tmp_path, "resume_path", str(tmp_path / "global_step_4")) == tmp_path / "global_step_4"
    with pytest.raises(RlcoreError, match="'resume_path' needs trainer.resume_from_path"):
        resolve_resume(tmp_path, "resume_path")
    with pytest.raises(RlcoreError, match=r"trainer.resume_from_path = '.*global_step_9': not a checkpoint folder"):
        resolve_resume(tmp_path, "resume_path", str(tmp_path / "global_step_9"))
