"""``benchmarks/debug_train.py``: SDPA held to the kernels named, anomaly mode naming a NaN backward."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import debug_train  # noqa: E402


@pytest.fixture
def restored(monkeypatch):
    monkeypatch.setattr(F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    monkeypatch.setattr(torch.Tensor, "backward", torch.Tensor.backward)
    yield
    torch.autograd.set_detect_anomaly(False)


def test_sdpa_runs_only_on_the_kernels_named(restored):
    q = k = v = torch.randn(1, 2, 8, 16)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    debug_train.restrict_sdpa(["math"])
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), expected)
    debug_train.restrict_sdpa(["efficient"])  # the CPU has no memory-efficient kernel: torch refuses
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with pytest.raises(SystemExit, match="unknown SDPA kernels"):
        debug_train.restrict_sdpa(["fast"])


def test_anomaly_mode_names_the_operation_whose_backward_gives_nan(restored):
    debug_train.anomaly_everywhere()
    x = torch.tensor([0.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="SqrtBackward0"):
        torch.sqrt(x * 0.0 - 1.0).sum().backward()  # sqrt(-1) = nan in the forward and its backward


class SqrtOfZero(torch.nn.Module):
    """sqrt(x - x): finite forward (0), infinite backward (1 / (2 sqrt(0)))."""

    def forward(self, x):
        return torch.sqrt(x - x.detach()) + x


def test_the_trace_names_the_module_whose_backward_turns_finite_gradients_non_finite():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), SqrtOfZero(), torch.nn.Linear(4, 1))
    trace = debug_train.NonfiniteTrace(limit=1, echo=lambda *a, **k: None)
    trace.watch(model)
    model(torch.randn(3, 4)).sum().backward()
    assert len(trace.lines) == 1
    assert "1 (SqrtOfZero)" in trace.lines[0] and "outputs max" in trace.lines[0]
    assert not torch.isfinite(model[0].weight.grad).all()  # below it the gradient is non-finite too


def test_a_finite_backward_leaves_the_trace_empty():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    trace = debug_train.NonfiniteTrace(echo=lambda *a, **k: None)
    trace.watch(model)
    model(torch.randn(3, 4)).sum().backward()
    assert trace.lines == []


def test_a_line_becomes_rlcore_trains_arguments_with_its_data_written_as_parquet(tmp_path):
    from tests.conftest import SHARED, require_shared

    gsm8k = require_shared(SHARED / "data" / "gsm8k", "GSM8K")
    args = debug_train.line_arguments("ppo-line", tmp_path / "model", gsm8k, tmp_path, steps=1, batch=8, mini=4)
    given = dict(a.split("=", 1) for a in args)
    assert given["trainer.ray"] == "false" and given["async_training.mode"] == "off"
    assert given["trainer.default_local_dir"] == str(tmp_path / "run")
    assert given["data.train_batch_size"] == "8" and given["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"
    assert given["critic.model.path"] == str((tmp_path / "model").resolve())
    import pyarrow.parquet as pq

    for key in ("data.train_files", "data.val_files"):
        assert pq.read_table(given[key]).num_rows > 1000  # GSM8K's train (7473) and test (1319) splits


def test_the_gradient_profile_says_at_which_token_each_layers_gradient_peaks(tmp_path):
    from rlcore.testing import build_tiny_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", num_layers=2))
    lines: list[str] = []
    profile = debug_train.GradProfile(passes=1, echo=lambda line, **_: lines.append(line))
    profile.watch(model, "m")
    ids = torch.tensor([[5, 6, 7, 8]])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    logits[0, 2].sum().backward()  # only position 2's output is read: no gradient reaches position 3
    logits = model(input_ids=ids).logits
    logits.sum().backward()  # a second pass is not profiled
    assert [line.split(" backward")[0] for line in lines] == ["m layer 1", "m layer 0"]
    assert all("backward 1:" in line and "mask 1" in line and " of 4 " in line for line in lines)
    assert "position 2 of 4 (token 7" in lines[0]  # the read position itself carries the top layer's gradient
