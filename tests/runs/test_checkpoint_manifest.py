"""Checkpoints that can be trusted: a manifest written last, verified on resume with a fallback to
the newest intact checkpoint, and save failures that name the step."""

import errno
import json
import logging

import pytest

from rlcore.errors import RlcoreError
from rlcore.runs import checkpoint as checkpoints
from rlcore.runs.checkpoint import MANIFEST, STATE, CheckpointManager, resolve_resume, verify_checkpoint


def save(manager, step):
    staging = manager.begin(step)
    (staging / "actor").mkdir()
    (staging / "actor" / "shard.bin").write_bytes(bytes(range(200)) * 5)
    return manager.commit(staging, step, {"loader": {"position": step}})


def test_the_manifest_lists_every_file_with_size_and_checksum(tmp_path):
    folder = save(CheckpointManager(tmp_path), 1)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    assert set(files) == {"actor/shard.bin", STATE}
    assert files["actor/shard.bin"]["size"] == 1000 and len(files["actor/shard.bin"]["sha256"]) == 64
    assert verify_checkpoint(folder) is None


def test_a_half_written_trainer_state_falls_back_to_the_previous_checkpoint(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    newest = save(manager, 2)
    (newest / STATE).write_text('{"global_step": 2, "loa')
    with caplog.at_level(logging.WARNING):
        assert resolve_resume(tmp_path, "auto") == tmp_path / "global_step_1"
    assert f"{newest} (step 2) is damaged" in caplog.text and STATE in caplog.text
    assert "falling back" in caplog.text


def test_a_half_written_trainer_state_without_a_manifest_is_named_too(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    newest = save(manager, 2)
    (newest / MANIFEST).unlink()  # a checkpoint from before manifests
    (newest / STATE).write_text('{"global_step": 2, "loa')
    assert resolve_resume(tmp_path, "auto") == tmp_path / "global_step_1"
    assert "is not valid JSON" in caplog.text


@pytest.mark.parametrize("damage, said", [
    (lambda f: f.write_bytes(f.read_bytes()[:600]), "is 600 bytes where the manifest says 1000"),
    (lambda f: f.write_bytes(b"x" * 1000), "does not match its sha256"),
    (lambda f: f.unlink(), "is missing"),
])
def test_a_damaged_shard_is_named_with_its_step_and_skipped(tmp_path, caplog, damage, said):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    damage(save(manager, 2) / "actor" / "shard.bin")
    assert resolve_resume(tmp_path, "auto") == tmp_path / "global_step_1"
    assert "(step 2) is damaged" in caplog.text and "shard.bin" in caplog.text and said in caplog.text


def test_a_named_damaged_checkpoint_is_an_error_not_a_silent_swap(tmp_path):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    (save(manager, 2) / "actor" / "shard.bin").write_bytes(b"")
    with pytest.raises(RlcoreError, match=r"trainer.resume_mode: checkpoint .*global_step_2 is damaged: .*shard.bin"):
        resolve_resume(tmp_path, str(tmp_path / "global_step_2"))


def test_when_every_checkpoint_is_damaged_resume_refuses_to_start_over_silently(tmp_path):
    (save(CheckpointManager(tmp_path), 1) / STATE).write_text("")
    with pytest.raises(RlcoreError, match="no intact checkpoint.*trainer.resume_mode = 'disable'"):
        resolve_resume(tmp_path, "auto")


def test_a_full_disk_during_a_save_names_the_step_and_keeps_the_previous(tmp_path, monkeypatch):
    manager = CheckpointManager(tmp_path)
    save(manager, 1)
    staging = manager.begin(2)

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoints, "_write_atomically", full)
    with pytest.raises(RlcoreError, match=r"checkpoint of step 2 .* No space left on device .*"
                                          r"the checkpoint of step 1 is intact"):
        manager.commit(staging, 2, {})
    monkeypatch.undo()
    assert resolve_resume(tmp_path, "auto") == tmp_path / "global_step_1"
