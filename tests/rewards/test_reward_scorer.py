"""``RewardScorer``: dispatch by data_source, custom files as in verl's docs, errors and on_error = "zero"."""

from __future__ import annotations

import math
import pickle
import re
import textwrap

import numpy as np
import pytest
import torch

from rlcore.errors import RlcoreError, UnknownNameError
from rlcore.plugins.manager import PluginManager
from rlcore.plugins.registry import Provider, Registry
from rlcore.rewards.config import CustomRewardFunction, RewardConfig
from rlcore.rewards.custom import load_reward_function
from rlcore.rewards.scorer import RewardScorer

BUILT_IN = ["DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "hiyouga/geometry3k", "lighteval/MATH",
            "openai/gsm8k", "openai/openai_humaneval", "rlcore/arithmetic", "rlcore/code",
            "rlcore/gsm8k_tools", "rlcore/shapes"]


@pytest.fixture(scope="module")
def builtins() -> Registry:
    return PluginManager(autoload=False).registry("reward_functions")


def _registry(**functions) -> Registry:
    registry = Registry("reward_functions")
    for name, function in functions.items():
        registry.add(name, function, Provider("tests"))
    return registry


def _custom(tmp_path, source: str, name: str = "compute_score", **config) -> RewardConfig:
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(source))
    return RewardConfig(custom_reward_function=CustomRewardFunction(path=str(path), name=name), **config)


def test_builtins_are_registered_by_data_source(builtins):
    assert builtins.names() == BUILT_IN


def test_each_sample_is_scored_by_its_data_source(builtins):
    scorer = RewardScorer(RewardConfig(format_score=0.1), builtins)
    result = scorer.score(
        ["openai/gsm8k", "openai/gsm8k", "rlcore/arithmetic", "rlcore/arithmetic", "lighteval/MATH"],
        ["#### 18", "#### 17", "3 + 4 = 7", "#### 8", r"\boxed{\frac{1}{2}}"],
        ["18", "18", "7", "7", r"\frac12"],
        [None, {}, {"unformatted_score": 0.5}, None, None],
    )
    assert result.scores.dtype == torch.float32 and result.scores.shape == (5,)
    assert result.scores.tolist() == pytest.approx([1.0, 0.1, 0.5, 0.1, 1.0])
    assert list(result.extra) == ["acc", "format"]
    acc, form = result.extra["acc"], result.extra["format"]
    assert acc[:4] == [1.0, 0.0, 1.0, 0.0] and math.isnan(acc[4])  # MATH's float score has no extras
    assert form[:4] == [1.0, 1.0, 0.0, 1.0] and math.isnan(form[4])
    assert {k: v for k, v in result.metrics.items() if k != "timing_s/reward_slowest_sample"} == {"reward/timeouts": 0.0}


def test_an_unknown_data_source_lists_the_registered_ones(builtins):
    with pytest.raises(UnknownNameError, match=r"'my/data'.*registered: DigitalLearningGmbH.*custom_reward_function"):
        RewardScorer(RewardConfig(), builtins).score(["my/data"], ["x"], ["1"], [None])


VERL_DOCS_EXAMPLE = """
    def my_reward_fn(data_source, solution_str, ground_truth, extra_info=None):
        return len(solution_str) / 100
"""


def test_a_custom_file_as_in_verls_docs_scores_every_source(tmp_path, builtins):
    config = _custom(tmp_path, VERL_DOCS_EXAMPLE, name="my_reward_fn", format_score=0.5)
    result = RewardScorer(config, builtins).score(["openai/gsm8k", "any/thing"], ["#### 1", "x" * 50],
                                                  ["2", None], [None, {"split": "test"}])
    assert result.scores.tolist() == pytest.approx([0.06, 0.5])  # and format_score is not passed to it


def test_a_custom_function_gets_verls_keywords_and_may_return_a_dict(tmp_path):
    config = _custom(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            assert not kwargs
            right = solution_str.strip() == ground_truth
            return {"score": float(right), "acc": right, "pred": solution_str, "source_len": len(data_source)}
    """)
    result = RewardScorer(config, _registry()).score(["a", "bb"], ["1", "2"], ["1", "3"], [None, None])
    assert result.scores.tolist() == [1.0, 0.0]
    assert result.extra == {"acc": [1.0, 0.0], "source_len": [1.0, 2.0]}  # "pred" is text: not an extra
    assert result.preds == ["1", "2"]  # the answers, for validation's maj@k


def test_preds_are_none_where_a_function_gives_none(tmp_path):
    config = _custom(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            return {"score": 1.0, "pred": 7} if solution_str == "a" else 0.0
    """)
    scorer = RewardScorer(config, _registry())
    assert scorer.score(["s", "s"], ["a", "b"], ["1", "1"], [None, None]).preds == ["7", None]
    assert scorer.score(["s"], ["b"], ["1"], [None]).preds is None  # no answer anywhere: no maj@k


def test_a_missing_file_or_function_is_named(tmp_path):
    with pytest.raises(RlcoreError, match=r"path = '.*absent\.py', name = 'compute_score'.*does not exist"):
        load_reward_function(str(tmp_path / "absent.py"))
    config = _custom(tmp_path, VERL_DOCS_EXAMPLE, name="compute_score")
    with pytest.raises(RlcoreError, match=r"my_reward\.py has no function 'compute_score'; functions it defines: "
                                          r"my_reward_fn"):
        RewardScorer(config, _registry())
    config = _custom(tmp_path, "import not_a_module_anywhere\n")
    importing = r"(?s)importing .*my_reward\.py failed:\n  File .*my_reward\.py\", line 1.*ModuleNotFoundError"
    with pytest.raises(RlcoreError, match=importing):
        RewardScorer(config, _registry())


def _failing(i, data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise KeyError("answer")
    return {"nan": math.nan, "str": "1", "none": None, "nodict": {"acc": 1.0}, "ok": 1}[solution_str]


def test_a_raising_function_stops_with_the_function_and_sample_named():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return _failing(0, data_source, solution_str, ground_truth)

    scorer = RewardScorer(RewardConfig(), _registry(src=compute_score))
    with pytest.raises(RlcoreError) as info:
        scorer.score(["src", "src"], ["ok", "boom"], ["1", "1"], [None, None])
    message = str(info.value)
    assert f"{__name__}:" in message and "compute_score" in message
    assert "raised KeyError: 'answer' on sample 1 (data_source 'src', response 'boom')" in message
    assert 'reward.on_error = "zero"' in message


@pytest.mark.parametrize("response, problem", [
    ("nan", "returned nan (float), not a finite number"),
    ("str", "returned '1' (str), not a finite number"),
    ("none", "returned None (NoneType)"),
    ("nodict", "returned a dict without a 'score' key (keys: acc)"),
])
def test_a_non_number_stops_with_the_sample_named(response, problem):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return _failing(0, data_source, solution_str, ground_truth)

    scorer = RewardScorer(RewardConfig(), _registry(src=compute_score))
    where = rf"on sample 0 \(data_source 'src', response '{response}'\)"
    with pytest.raises(RlcoreError, match=rf"{re.escape(problem)}.* {where}"):
        scorer.score(["src"], [response], ["1"], [None])


def test_a_long_response_is_cut_to_80_characters_in_the_error():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        raise ValueError("bad")

    with pytest.raises(RlcoreError) as info:
        RewardScorer(RewardConfig(), _registry(src=compute_score)).score(["src"], ["y" * 200], ["1"], [None])
    assert f"response '{'y' * 80}')" in str(info.value)


def test_on_error_zero_scores_failures_0_and_counts_them(caplog):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return _failing(0, data_source, solution_str, ground_truth)

    scorer = RewardScorer(RewardConfig(on_error="zero"), _registry(src=compute_score))
    result = scorer.score(["src"] * 4, ["ok", "boom", "str", "ok"], ["1"] * 4, None)
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert result.metrics["reward/errors"] == 2.0 and result.metrics["reward/timeouts"] == 0.0
    assert "2 of 4 samples scored 0" in caplog.text
    assert scorer.score(["src"], ["ok"], ["1"], [None]).metrics["reward/errors"] == 0.0


@pytest.mark.parametrize("value, expected", [
    (True, 1.0), (0, 0.0), (np.float32(0.25), 0.25), (np.bool_(True), 1.0), (torch.tensor(0.5), 0.5),
    ({"score": np.float64(0.75), "acc": np.bool_(False)}, 0.75),
])
def test_numbers_of_many_kinds_are_accepted(value, expected):
    scorer = RewardScorer(RewardConfig(), _registry(src=lambda **kwargs: value))
    assert scorer.score(["src"], ["x"], ["1"], [None]).scores.tolist() == [expected]


def test_a_scorer_with_a_custom_function_pickles(tmp_path):
    config = _custom(tmp_path, VERL_DOCS_EXAMPLE, name="my_reward_fn")
    scorer = pickle.loads(pickle.dumps(RewardScorer(config, _registry())))
    assert scorer.score(["a"], ["x" * 10], ["1"], [None]).scores.tolist() == pytest.approx([0.1])


def test_an_unknown_data_source_is_named_with_its_file_and_row_before_scoring(builtins):
    scorer = RewardScorer(RewardConfig(), builtins)
    rows = [{"data_source": "openai/gsm8k", "file": "train.parquet", "row": 0},
            {"data_source": "mystery/x", "file": "train.parquet", "row": 1},
            {"data_source": "mystery/x", "file": "test.parquet", "row": 5}]
    with pytest.raises(UnknownNameError, match=r"^train\.parquet, row 1: no reward function for data_source "
                                               r"'mystery/x'.*registered: .*openai/gsm8k"):
        scorer.check_sources(rows)
    scorer.check_sources(rows[:1])  # known sources pass


BATCH_FUNCTION = """
    def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
        assert not kwargs and len(data_sources) == len(solution_strs) == len(ground_truths) == len(extra_infos)
        return [{"score": float(s == t) + 0.5 * len(d), "acc": s == t}
                for d, s, t in zip(data_sources, solution_strs, ground_truths)]
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_a_batch_function_is_called_with_lists_and_gives_one_score_a_sample(tmp_path, workers):
    """verl's batch reward manager: compute_score(data_sources, solution_strs, ...) -> a list."""
    path = tmp_path / "batch_reward.py"
    path.write_text(textwrap.dedent(BATCH_FUNCTION))
    config = RewardConfig(custom_reward_function=CustomRewardFunction(path=str(path), batch=True), num_workers=workers)
    scorer = RewardScorer(config, _registry())
    try:
        result = scorer.score(["a", "bb", "a"], ["1", "2", "3"], ["1", "3", "3"], [None, {"k": 1}, None])
    finally:
        scorer.close()
    assert result.scores.tolist() == [1.5, 1.0, 1.5]
    assert result.extra == {"acc": [1.0, 0.0, 1.0]}


def test_a_batch_function_returning_the_wrong_count_is_named(tmp_path):
    path = tmp_path / "short.py"
    path.write_text("def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n    return [1.0]\n")
    config = RewardConfig(custom_reward_function=CustomRewardFunction(path=str(path), batch=True), num_workers=0)
    with pytest.raises(RlcoreError, match=r"returned 1 values, not a list of 2 scores on sample 0"):
        RewardScorer(config, _registry()).score(["a", "a"], ["1", "2"], ["1", "2"], [None, None])
