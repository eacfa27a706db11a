"""perf/mfu/*: the FLOPs counted from a model's config equal what torch's FLOP counter measures on
the model itself, and MFU is those FLOPs over the time taken times the devices' peak."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rlcore.metrics.flops import MfuMeter, forward_flops_function, peak_flops
from rlcore.testing import build_tiny_model


def measured_flops(model, length: int, backward: bool = False) -> int:
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids).logits
        if backward:
            logits.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_forward_and_training_flops_equal_torchs_flop_counter(tmp_path, family):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / family, family=family, hidden_size=48, num_heads=6, num_kv_heads=2,
                            intermediate_size=80)
    # eager attention: its two matmuls are visible to the counter (the full square, as verl counts)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    flops = forward_flops_function(model.config)
    for length in (5, 31):
        assert flops([length]) == measured_flops(model, length)
    assert 3 * flops([9]) == measured_flops(model, 9, backward=True)
    assert flops([5, 31]) == flops([5]) + flops([31])  # sequences are counted one by one


def test_architectures_it_cannot_count_get_no_figure():
    dense = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=512)
    assert forward_flops_function(SimpleNamespace(**dense)) is not None
    assert forward_flops_function(SimpleNamespace(**dense, num_local_experts=8)) is None
    assert forward_flops_function(SimpleNamespace(**{**dense, "intermediate_size": None})) is None


def test_peak_comes_from_the_job_then_the_device_name():
    assert peak_flops("NVIDIA H200", None) == 989e12
    assert peak_flops("NVIDIA H100 PCIe", None) == 756e12  # the specific name before "H100"
    assert peak_flops("NVIDIA H200", 100.0) == 100e12
    assert peak_flops("Some Accelerator", None) is None


def test_mfu_is_the_flops_over_time_devices_and_peak():
    meter = MfuMeter(lambda lengths: 1e12 * sum(lengths), peak=2e12, ppo_epochs=2)
    metrics = meter.metrics([1, 3], {"update_actor": 8.0, "old_log_prob": 1.0, "gen": 5.0}, devices=2)
    assert metrics == {"perf/mfu/actor": pytest.approx(4e12 * 3 * 2 / (8.0 * 2 * 2e12)),
                       "perf/mfu/actor_infer": pytest.approx(4e12 / (1.0 * 2 * 2e12))}
    assert MfuMeter(lambda lengths: 1.0, peak=None).metrics([1], {"update_actor": 1.0}, devices=1) == {}
