"""benchmarks/learning_runs.py, the learning runs of the GSM8K job beside verl and in both one-GPU forms:
verl's reward file scores as rlcore's reward does, both systems see the prompts in the same order, the
jobs are what the issues ask for, and the validation values are read from what each system really logs
(rlcore: a tiny model's run, stopped and resumed; verl: its own metric functions)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.e2e.conftest import gsm8k_parquet, job_overrides, tiny_model  # noqa: F401 - fixtures

sys.path.insert(0, str(REPO / "benchmarks"))
import learning_runs  # noqa: E402

SOLUTIONS = [("so 18 in all. #### 18", "18"), ("#### 17", "18"), ("the answer is 18", "18"), ("#### 1,000", "1000"),
             ("#### -3 then #### 4", "4"), ("#### 4 then #### -3", "4"), ("x" * 400 + " #### 7", "7"),
             ("#### 7" + "x" * 400, "7"), ("#### $12", "12"), ("", "0")]


def test_verls_reward_file_scores_as_rlcores_gsm8k_reward_with_format_score():
    pytest.importorskip("verl", reason="verl is not installed here (README's test command installs it)")
    from rlcore.rewards.gsm8k import compute_score as rlcore_score

    spec = importlib.util.spec_from_file_location("gsm8k_format", learning_runs.VERL_REWARD)
    verl_reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verl_reward)
    for solution, truth in SOLUTIONS:
        ours = rlcore_score("openai/gsm8k", solution, truth, format_score=0.1)
        theirs = verl_reward.compute_score("openai/gsm8k", solution, truth)
        assert {key: ours[key] for key in ("score", "acc", "format")} == theirs, solution
    assert {verl_reward.compute_score("openai/gsm8k", s, t)["score"] for s, t in SOLUTIONS} == {0.0, 0.1, 1.0}


def test_both_systems_draw_the_prompts_in_the_same_order(tiny_model, gsm8k_parquet, tmp_path):
    """rlcore's first epoch is torch.randperm of a generator seeded with data.seed; verl's sampler (torchdata's
    RandomSampler with data.seed, verl.trainer.ppo.utils.create_rl_sampler) draws the same permutation."""
    from rlcore.config import load_job
    from rlcore.data.dataset import PromptLoader

    job = load_job(None, learning_runs.rlcore_overrides(gsm8k_parquet / "train.parquet", gsm8k_parquet / "test.parquet",
                                                        30, 10, "lockstep")[1:] +
                   [f"model.path={tiny_model}", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"],
                   check=False).config
    assert job.data.seed == learning_runs.SEED and job.data.shuffle
    expected = torch.randperm(16, generator=torch.Generator().manual_seed(learning_runs.SEED)).tolist()
    assert PromptLoader(list(range(16)), 4, shuffle=job.data.shuffle, seed=job.data.seed).order(0) == expected
    if importlib.util.find_spec("torchdata") is not None:
        from torchdata.stateful_dataloader.sampler import RandomSampler

        generator = torch.Generator()
        generator.manual_seed(learning_runs.SEED)
        assert list(RandomSampler(range(16), generator=generator)) == expected


@pytest.mark.parametrize("form", list(learning_runs.FORMS))
def test_the_rlcore_job_is_the_example_with_the_issues_changes(gsm8k_parquet, form):
    from rlcore.config import load_job

    overrides = learning_runs.rlcore_overrides(gsm8k_parquet / "train.parquet", gsm8k_parquet / "test.parquet",
                                               30, 10, form)
    config = load_job(overrides[0], overrides[1:], check=False).config
    assert (config.reward.format_score, config.actor.optim.lr) == (0.1, 3e-6)
    trainer = config.trainer
    assert (trainer.total_training_steps, trainer.test_freq, trainer.save_freq) == (30, 10, 10)
    assert trainer.val_before_train
    assert not config.rollout.val.do_sample and tuple(config.data.val_files) == (str(gsm8k_parquet / "test.parquet"),)
    mode = {"lockstep": "off", "default": "auto"}.get(form, "colocated")
    assert config.section("async_training").mode == mode
    assert config.algorithm.rollout_bypass == (form == "colocated-bypass")
    assert config.rollout.calculate_log_probs == (form != "colocated-uncorrected")
    assert (config.data.train_batch_size, config.rollout.n, config.data.max_response_length) == (64, 8, 512)


def test_the_verl_job_has_the_same_changes_and_verls_reward_file():
    overrides = learning_runs.verl_overrides(REPO / "model", REPO / "train.parquet", REPO / "test.parquet", 30, 10)
    keys = dict(o.split("=", 1) for o in overrides)
    assert keys["actor_rollout_ref.actor.optim.lr"] == "3e-6" and keys["trainer.total_training_steps"] == "30"
    assert (keys["trainer.val_before_train"], keys["trainer.test_freq"], keys["data.seed"]) == ("True", "10", "1")
    assert keys["reward.custom_reward_function.path"] == str(learning_runs.VERL_REWARD)
    assert keys["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "False"
    assert keys["actor_rollout_ref.model.use_remove_padding"] == "False"  # verl's faster form here (no flash-attn)
    assert keys["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "16384"  # fits an 80 GB card beside vLLM
    assert len(keys) == len(overrides)  # no key twice


def test_a_run_validates_checkpoints_and_resumes_where_it_stopped(tiny_model, gsm8k_parquet, tmp_path):
    """The rlcore run of the harness, scaled to a tiny model on the CPU (``rlcore train`` in a process of its
    own, as on the GPU): validations at steps 0, 1, 2 read from rlcore's own metrics; the same command for
    3 steps resumes from the step-2 checkpoint and adds step 3 only; a finished run is not started again."""
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    for split, rows in (("train", 8), ("test", 2)):  # rlcore data gsm8k's input: GSM8K's own jsonl
        lines = [f'{{"question": "What is {i} + {i}?", "answer": "It is {2 * i}.\\n#### {2 * i}"}}'
                 for i in range(rows)]
        (gsm8k / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    tiny = [o for o in job_overrides(tiny_model, gsm8k_parquet, tmp_path / "unused")
            if o.split("=")[0] in ("model.path", "data.train_batch_size", "data.max_response_length",
                                   "actor.ppo_mini_batch_size", "actor.ppo_micro_batch_size_per_gpu")]
    extra = [*tiny, "rollout.name=hf", "rollout.n=2", "trainer.ray=false"]
    work = tmp_path / "work"
    first = learning_runs.run_system("rlcore-lockstep", gsm8k, work, 2, 1, 240, extra)
    assert "stopped" not in first, first
    assert [row["step"] for row in first["validations"]] == [0, 1, 2]
    for row in first["validations"]:
        assert set(row) == {"step", "reward", "accuracy", "format rate"}
        assert 0 <= row["accuracy"] <= row["format rate"] <= 1 and row["reward"] >= row["accuracy"]
    assert learning_runs.finished(work, "rlcore-lockstep", 2) and not learning_runs.finished(work, "rlcore-lockstep", 3)

    second = learning_runs.run_system("rlcore-lockstep", gsm8k, work, 3, 1, 240, extra)
    assert (second["call"], [row["step"] for row in second["validations"]]) == (2, [3])
    assert [row["step"] for row in learning_runs.merged([first, second])["rlcore-lockstep"]] == [0, 1, 2, 3]
    table = learning_runs.table([first, second, {**first, "system": "rlcore-default"}])
    assert "rlcore-default (step 2) vs rlcore-lockstep (step 3)" in table


def test_validations_are_read_from_what_verl_logs():
    """verl's validation metrics for a reward with acc and format extras: its process_validation_metrics, filed
    as its trainer files them (val-core for acc, the rest val-aux: verl/trainer/ppo/ray_trainer.py)."""
    pytest.importorskip("verl", reason="verl is not installed here (README's test command installs it)")
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    infos = {"reward": [1.0, 0.1, 0.0, 0.1], "acc": [1.0, 0.0, 0.0, 0.0], "format": [1.0, 1.0, 0.0, 1.0]}
    logged = {"step": 10}
    for source, values in process_validation_metrics(["openai/gsm8k"] * 4, list("abcd"), infos).items():
        for name, metrics in values.items():
            for metric, value in metrics.items():
                group = "val-core" if name == "acc" and metric.startswith(("mean", "maj", "best")) else "val-aux"
                logged[f"{group}/{source}/{name}/{metric}"] = float(value)
    assert learning_runs.validations([logged]) == [{"step": 10, "reward": pytest.approx(0.3), "accuracy": 0.25,
                                                    "format rate": 0.75}]


def test_overrides_after_the_double_dash_reach_every_system(tmp_path, monkeypatch):
    """``run verl rlcore-default ... -- data.train_batch_size=16 ...``: the same cut for both systems (the
    positional overrides before were refused by the parser after the options, so no cut could be given)."""
    calls = []
    monkeypatch.setattr(learning_runs, "run_system", lambda system, *args: calls.append((system, args[-1])) or
                        {"system": system, "validations": []})
    argv = ["run", "verl", "rlcore-default", "--gsm8k", str(tmp_path), "--work", str(tmp_path / "work"),
            "--results", str(tmp_path / "learn.jsonl"), "--timeout", "3000", "--",
            "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    assert learning_runs.main(argv) == 0
    cut = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    assert calls == [("verl", cut), ("rlcore-default", cut)]
    assert len((tmp_path / "learn.jsonl").read_text().splitlines()) == 2


def test_a_system_that_fails_leaves_the_sitting_to_the_others(tmp_path, monkeypatch):
    """On the GPU (2026-12-06) verl stopped at its first model and the rlcore run after it never started:
    the failure was the whole sitting's. Now it is the failed system's record, and the next system runs."""
    calls = []

    def run_system(system, *args):
        calls.append(system)
        if system == "verl":
            raise SystemExit("python3 -m verl.trainer.main_ppo ... failed with exit status 1")
        return {"system": system, "validations": [{"step": 0, "reward": 0.0139, "accuracy": 0.003,
                                                   "format rate": 0.11}]}

    monkeypatch.setattr(learning_runs, "run_system", run_system)
    results = tmp_path / "learn.jsonl"
    argv = ["run", "verl", "rlcore-default", "--gsm8k", str(tmp_path), "--work", str(tmp_path / "work"),
            "--results", str(results)]
    assert learning_runs.main(argv) == 0
    assert calls == ["verl", "rlcore-default"]
    table = learning_runs.table([json.loads(line) for line in results.read_text().splitlines()])
    assert "| verl | failed: python3 -m verl.trainer.main_ppo ... failed with exit status 1 | | | |" in table
    assert "| rlcore-default | 0 | 0.0139 | 0.0030 | 0.1100 |" in table
