"""``[profiler]``: off unless steps are named; clear refusals; settings without effect warned by name."""

from __future__ import annotations

import re

import pytest

from rlcore.config import load_job
from rlcore.errors import RlcoreError


def test_off_by_default_and_on_for_the_steps_named():
    default = load_job(None, []).config.section("profiler")
    assert not default.enabled and default.traces_rank(0) and not default.traces_rank(1)
    on = load_job(None, ["profiler.steps=[2, 5]", "profiler.ranks=[1]"]).config.section("profiler")
    assert on.enabled and on.steps == (2, 5) and on.traces_rank(1) and not on.traces_rank(0)
    assert load_job(None, ["profiler.steps=[1]", "profiler.all_ranks=true"]).config.section("profiler").traces_rank(7)


@pytest.mark.parametrize("overrides, message", [
    (["profiler.steps=[0, 2]"], "profiler.steps = [0, 2]: training steps count from 1"),
    (["profiler.steps=[2, 2]"], "profiler.steps = [2, 2] names a step twice"),
    (["profiler.steps=[2]", 'profiler.activities=["cuda"]'], "profiler.activities = ['cuda']: expected one or both "
                                                             "of 'cpu', 'device'"),
    (["profiler.steps=[2]", "profiler.ranks=[-1]"], "profiler.ranks = [-1]: ranks count from 0"),
    (["profiler.steps=[4]", "trainer.total_training_steps=3"], "profiler.steps = [4] names steps after the last one "
                                                               "(trainer.total_training_steps = 3)"),
])
def test_what_cannot_be_traced_is_refused_naming_the_key(overrides, message):
    with pytest.raises(RlcoreError, match=re.escape(message)):
        load_job(None, overrides)


def test_settings_without_steps_are_warned_by_name():
    job = load_job(None, ["profiler.with_stack=true", "profiler.dir=traces"])
    assert "profiler.with_stack has no effect without profiler.steps (the steps to trace)" in job.warnings
    assert "profiler.dir has no effect without profiler.steps (the steps to trace)" in job.warnings
    assert not [w for w in load_job(None, ["profiler.steps=[1]", "profiler.with_stack=true"]).warnings
                if w.startswith("profiler.")]


def test_an_engine_computing_in_a_process_of_its_own_is_warned_of():
    """SGLang's scheduler runs the model in a subprocess: a trace of the worker would miss its kernels."""
    job = load_job(None, ["profiler.steps=[1]", 'rollout.name="sglang"'])
    (warning,) = [w for w in job.warnings if w.startswith("profiler.steps")]
    assert warning.startswith("profiler.steps: the 'sglang' rollout engine (rollout.name) runs its model in a process "
                              "of its own, which the profiler does not trace")
    assert "(engines traced whole: 'hf', 'vllm')" in warning
    for engine in ("hf", "vllm"):
        assert not [w for w in load_job(None, ["profiler.steps=[1]", f'rollout.name="{engine}"']).warnings
                    if w.startswith("profiler.")]
