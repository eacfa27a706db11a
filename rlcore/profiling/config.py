"""``[profiler]``: which training steps are traced, in which ranks, and what torch's profiler records."""

from __future__ import annotations

import attrs

from rlcore.plugins.settings import setting
from rlcore.rollout.declared import engine_declares, engines_declaring

ACTIVITIES = ("cpu", "device")


@attrs.frozen
class ProfilerConfig:
    steps: tuple[int, ...] = setting((), doc="training steps to trace with torch's profiler, counted from 1 (each "
                                             "from its generation to its weight sync, in every worker process of "
                                             "the ranks chosen); empty: no profiling")
    dir: str = setting("", doc="where the traces and step_N/summary.json go; empty: the run folder's profile/; "
                               "each worker writes its own trace, so on several nodes a folder they all see")
    ranks: tuple[int, ...] = setting((0,), doc="the ranks of each worker group traced (trainer, rollout, critic)")
    all_ranks: bool = setting(False, doc="trace every rank of every worker group (ranks is then ignored)")
    activities: tuple[str, ...] = setting(ACTIVITIES, doc="cpu: the operators each thread runs; device: the "
                                                          "accelerator's kernels and copies (skipped with a "
                                                          "note where torch's profiler cannot see the device)")
    record_shapes: bool = setting(False, doc="record each operator's input shapes")
    with_stack: bool = setting(False, doc="record the Python stack of each operator (large traces)")
    profile_memory: bool = setting(False, doc="record tensor allocations and frees")

    @property
    def enabled(self) -> bool:
        return bool(self.steps)

    def traces_rank(self, rank: int) -> bool:
        return self.all_ranks or rank in self.ranks


def profiler_problems(job) -> list[str]:
    """Errors of a ``[profiler]`` table, each naming its key."""
    if "profiler" not in job.config.sections:  # a manager without the core's plugins (some tests)
        return []
    section: ProfilerConfig = job.config.section("profiler")
    problems = []
    if any(step < 1 for step in section.steps):
        problems.append(f"profiler.steps = {list(section.steps)}: training steps count from 1; give steps >= 1")
    if len(set(section.steps)) != len(section.steps):
        problems.append(f"profiler.steps = {list(section.steps)} names a step twice; give each step once")
    unknown = [a for a in section.activities if a not in ACTIVITIES]
    if unknown or not section.activities:
        problems.append(f"profiler.activities = {list(section.activities)}: expected one or both of "
                        f"{', '.join(map(repr, ACTIVITIES))}")
    if any(rank < 0 for rank in section.ranks):
        problems.append(f"profiler.ranks = {list(section.ranks)}: ranks count from 0")
    total = job.config.trainer.total_training_steps
    if total and any(step > total for step in section.steps):
        problems.append(f"profiler.steps = {list(section.steps)} names steps after the last one "
                        f"(trainer.total_training_steps = {total})")
    return problems


def profiler_unused(job) -> list[str]:
    """Settings of ``[profiler]`` that do nothing without ``profiler.steps``; an engine whose model runs in a
    process of its own, which the traces leave out."""
    if "profiler" not in job.config.sections:
        return []
    if not job.config.section("profiler").enabled:
        return [f"{key} has no effect without profiler.steps (the steps to trace)"
                for key in job.given("profiler") if key != "profiler.steps"]
    engine, manager = job.config.rollout.name, job.manager
    if manager is None or engine not in manager.registry("rollout_engines") or engine_declares(
            manager, engine, "computes_in_worker_process"):
        return []
    tracing = engines_declaring(manager, "computes_in_worker_process")
    return [f"profiler.steps: the {engine!r} rollout engine (rollout.name) runs its model in a process of its own, "
            "which the profiler does not trace: the traces hold the workers' own work, not its generation kernels "
            f"(engines traced whole: {', '.join(map(repr, tracing)) or 'none installed'}); use the engine's own "
            "profiler for those"]
