"""A multi-turn GRPO job with the calculator tool on a tiny model, through the real CLI, Ray, FSDP2 and
the hf engine: the machinery runs end to end (the scripted policy in tests/rollout proves the calls)."""

from tests.e2e.conftest import job_overrides, read_metrics, train


def test_multi_turn_grpo_job_runs_with_hf(tiny_model, gsm8k_parquet, tmp_path):
    run = tmp_path / "multi_turn"
    result = train(*job_overrides(tiny_model, gsm8k_parquet, run, **{
        "data.max_response_length": 24, "trainer.save_freq": -1, "trainer.test_freq": -1,
        "trainer.val_before_train": False}),
        "algorithm.adv_estimator=grpo", "rollout.n=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        'actor_rollout_ref.rollout.multi_turn.tools=["calculator"]',
        "data.max_prompt_length=1024")
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for name in ("num_turns/min", "num_turns/max", "num_turns/mean", "tool_calls/total", "tool_calls/malformed",
                 "tool_calls/errors", "timing_s/tools", "actor/pg_loss", "critic/score/mean"):
        assert name in metrics[0], name
    assert 1 <= metrics[0]["num_turns/min"] <= metrics[0]["num_turns/max"] <= 2
