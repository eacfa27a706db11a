"""Several distillation teachers, one per data source (``rlcore.workers.teachers``), on the fsdp
backend's reference role: each row's ``ref_log_prob`` is its data source's teacher's."""

from __future__ import annotations

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.testing import build_reference
from rlcore.workers.teachers import build_teachers
from tests.fsdp.helpers import evolve, job, make_batch


@pytest.fixture(scope="module")
def teacher_paths(tmp_path_factory):
    from rlcore.testing import build_tiny_model

    root = tmp_path_factory.mktemp("teachers")
    return {name: str(build_tiny_model(root / name, seed=seed)) for name, seed in (("math", 11), ("code", 12),
                                                                                      ("other", 13))}


def _distilling(tiny_model_path, **distillation):
    return evolve(job(tiny_model_path), distillation={"enable": True, **distillation})


def _alone(backend, platform, tiny_model_path, path, batch):
    """One teacher as the single-teacher job loads it: the expected log-probs, computed apart."""
    reference = build_reference(backend, _distilling(tiny_model_path, teacher_path=path), platform)
    return reference.compute_ref_log_prob(batch)["ref_log_prob"]


def test_each_row_is_scored_by_its_data_sources_teacher(backend, platform, tiny_model_path, teacher_paths):
    sources = ["math", "code", "code", "math", "other"]
    batch = make_batch(len(sources))
    batch = Batch(batch.tensors, batch.rows | {"data_source": sources}, batch.meta)
    config = _distilling(tiny_model_path, teachers={"math": teacher_paths["math"], "code": teacher_paths["code"]},
                         teacher_path=teacher_paths["other"])
    scored = build_teachers(config, platform, backend).compute_ref_log_prob(batch)["ref_log_prob"]
    expected = {name: _alone(backend, platform, tiny_model_path, path, batch) for name, path in teacher_paths.items()}
    assert not torch.allclose(expected["math"], expected["code"])  # the teachers differ
    for row, source in enumerate(sources):
        torch.testing.assert_close(scored[row], expected[source][row])


def test_a_data_source_without_a_teacher_is_named(backend, platform, tiny_model_path, teacher_paths):
    batch = make_batch(2)
    batch = Batch(batch.tensors, batch.rows | {"data_source": ["math", "poetry"]}, batch.meta)
    teachers = build_teachers(_distilling(tiny_model_path, teachers={"math": teacher_paths["math"]}), platform,
                              backend)
    with pytest.raises(RlcoreError, match=r"no teacher for data_source 'poetry' \(teachers: 'math'\); add one, or "
                                          r"set distillation.teacher_path"):
        teachers.compute_ref_log_prob(batch)
