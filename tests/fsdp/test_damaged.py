"""A truncated shard is named with its step by export (manifest) and by a load (no manifest)."""

from __future__ import annotations

import pytest

from rlcore.errors import RlcoreError
from rlcore.runs.checkpoint import MANIFEST, CheckpointManager
from rlcore.testing import build_actor
from rlcore_fsdp.export import export_checkpoint
from tests.fsdp.helpers import job


@pytest.fixture
def truncated(backend, platform, tiny_model_path, tmp_path):
    """An actor checkpoint at step 3 of a run folder, one of its shard files cut short."""
    actor = build_actor(backend, job(tiny_model_path), platform)
    manager = CheckpointManager(tmp_path / "run")
    staging = manager.begin(3)
    actor.save(str(staging / "actor"))
    step = manager.commit(staging, 3, {})
    shard = max((step / "actor" / "shards").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:64])  # as a full disk leaves it
    return actor, step, shard


def test_export_of_a_truncated_shard_names_the_file_and_step(truncated, tmp_path):
    _, step, shard = truncated
    with pytest.raises(RlcoreError, match=rf"rlcore export: checkpoint .*global_step_3 is damaged: .*{shard.name} is "):
        export_checkpoint(str(step), str(tmp_path / "out"))
    (step / MANIFEST).unlink()  # without the manifest, torch's own failure is still named with the folder
    with pytest.raises(RlcoreError, match=r"global_step_3/actor/shards could not be read, the checkpoint is damaged"):
        export_checkpoint(str(step), str(tmp_path / "out"))


def test_loading_a_truncated_shard_names_the_folder(truncated):
    actor, step, _ = truncated
    with pytest.raises(RlcoreError, match=r"global_step_3/actor/shards could not be read, the checkpoint is damaged"):
        actor.load(str(step / "actor"))
