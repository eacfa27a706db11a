from pathlib import Path

import pytest

from rlcore.config import load_job

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_jobs_validate(path):
    job = load_job(path)
    assert job.warnings == ()


def test_the_quickstart_runs_grpo_on_the_embedded_model():
    config = load_job(Path(EXAMPLES[0]).parent / "quickstart.toml").config
    assert config.model.path == "embedded:smollm2-135m-instruct" and config.algorithm.adv_estimator == "grpo"
