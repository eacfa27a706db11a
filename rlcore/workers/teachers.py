"""Several distillation teachers, one per data source (``distillation.teachers``), in the reference's
place: each teacher is a reference role of the training backend on its own model, and each sample's
``ref_log_prob`` is its data source's teacher's.

Every teacher scores the whole shard, then each row keeps its own teacher's log-probs. That costs one
pass per teacher, but every rank runs the same passes whatever the data sources of its rows, so a
sharded teacher's collectives stay in step across ranks.
"""

from __future__ import annotations

import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.training.roles import Reference
from rlcore.training.specs import reference_spec, teacher_spec

REST = None  # the key of distillation.teacher_path among the teachers: the samples of any other data source


class TeachersBySource(Reference):
    def __init__(self, teachers: dict[str | None, Reference]):
        self.teachers = teachers

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        sources = batch["data_source"]
        missing = sorted({s for s in sources if s not in self.teachers} if REST not in self.teachers else set())
        if missing:
            known = ", ".join(repr(s) for s in self.teachers if s is not REST)
            raise RlcoreError(f"distillation.teachers has no teacher for data_source {missing[0]!r} (teachers: "
                              f"{known}); add one, or set distillation.teacher_path for the other data sources")
        scored = {source: teacher.compute_ref_log_prob(batch)
                  for source, teacher in self.teachers.items()}  # each ref_log_prob (B, R) (and the top k, (B, R, K))
        first = next(iter(scored.values()))
        chosen = [scored[source if source in scored else REST] for source in sources]
        return Batch({key: torch.stack([out[key][row] for row, out in enumerate(chosen)]) if chosen else first[key]
                      for key in first.tensors})


def build_teachers(config, platform, backend) -> TeachersBySource:
    """One reference of ``backend`` per teacher of ``config.distillation.teachers`` (and one on
    ``teacher_path`` for the other data sources, when it is set): the job's reference spec, each on
    its teacher's model."""
    settings, spec = config.distillation, reference_spec(config)
    paths: dict[str | None, str] = dict(settings.teachers)
    if settings.teacher_path:
        paths[REST] = settings.teacher_path
    return TeachersBySource({source: backend.reference(teacher_spec(spec, path), platform)
                             for source, path in paths.items()})
