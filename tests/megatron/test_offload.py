"""Parameter and gradient offload (rlcore_megatron.offload) on the CPU.

megatron-core's DDP allocates its buffers with ``torch.cuda.current_device()`` and its forward needs
CUDA, so the whole actor with offload is checked on GPUs (tests/megatron/test_on_device.py). Here:
(1) the round trip on a model laid out as Megatron's DDP lays it out (every parameter's ``data`` and
``main_grad`` are views of two flat buffers) leaves two training steps bit-identical to no offload,
and while parked the buffers hold no memory and the views are the same objects; (2) the real
``GPTModel`` megatron-core builds on the CPU parks its parameters and gets back exactly the Hugging
Face weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlcore_megatron.offload import ModelOffload
from tests.megatron.conftest import needs_megatron
from tests.megatron.test_model import one_rank_layout  # noqa: F401 - the fixture


class FlatBuffers:
    """A model's parameters and gradients in two flat buffers, as Megatron's ``_ParamAndGradBuffer``
    keeps them (its ``params``, ``param_data`` and ``grad_data``): each ``param.data`` and
    ``param.main_grad`` is a view, and backward hooks add each gradient into ``main_grad``."""

    def __init__(self, module: nn.Module):
        self.params = list(module.parameters())
        total = sum(p.numel() for p in self.params)
        self.param_data = torch.zeros(total)
        self.grad_data = torch.zeros(total)
        start = 0
        for param in self.params:
            end = start + param.numel()
            self.param_data[start:end].copy_(param.data.view(-1))
            param.data = self.param_data[start:end].view(param.shape)
            param.main_grad = self.grad_data[start:end].view(param.shape)
            param.register_post_accumulate_grad_hook(self._accumulate)
            start = end

    @staticmethod
    def _accumulate(param: nn.Parameter) -> None:
        param.main_grad.add_(param.grad)
        param.grad = None


def train(offload_params: bool, offload_grads: bool, seen: list | None = None):
    """Two steps of Adam on a small MLP; between phases the model is parked when asked. Returns the
    losses of every phase and the final weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    buffers = FlatBuffers(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    offload = ModelOffload(model, [buffers], params=offload_params, grads=offload_grads)
    if offload.enabled:
        offload.park()
    inputs, targets = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.randn(32, 4)
    losses = []
    for _ in range(2):
        if seen is not None:
            seen.append((offload.device_bytes(), buffers.param_data.untyped_storage().nbytes(),
                         buffers.grad_data.untyped_storage().nbytes(), [id(p.data) for p in model.parameters()]))
        with offload.resident():  # a log-prob phase: parameters only
            with torch.no_grad():
                losses.append(float(nn.functional.mse_loss(model(inputs), targets)))
        with offload.resident(grads=True):  # the update: parameters and zeroed gradients
            buffers.grad_data.zero_()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            for param in model.parameters():
                param.grad = param.main_grad.clone()
            optimizer.step()
            losses.append(float(loss))
    with offload.resident():
        weights = buffers.param_data.clone()
    return losses, weights, offload, buffers


@pytest.mark.parametrize("params, grads", [(True, True), (True, False), (False, True)])
def test_training_with_offload_between_phases_is_bit_identical_to_none(params, grads):
    plain_losses, plain_weights, _, _ = train(False, False)
    seen = []
    losses, weights, offload, buffers = train(params, grads, seen)
    assert losses == plain_losses and torch.equal(weights, plain_weights)
    assert offload.parks == 1 + 2 * 2 + 1  # at start, after each phase of both steps, after the last read
    size = buffers.param_data.numel() * 4
    for device_bytes, param_bytes, grad_bytes, data_ids in seen:  # between phases
        assert device_bytes == 0
        assert param_bytes == (0 if params else size) and grad_bytes == (0 if grads else size)
    if params:
        host = offload.params[0].host.view(torch.float32)
        assert host.device == torch.device("cpu") and torch.equal(host, plain_weights)  # the last park's copy


def test_the_gpt_model_parks_its_parameters_and_gets_back_the_hf_weights(
        tiny_model_path, one_rank_layout):  # noqa: F811 - the fixture imported above
    needs_megatron()
    from transformers import AutoModelForCausalLM

    from rlcore_megatron.model import HfCheckpoint, build_model, hf_weight_stream, load_hf_weights, shape_of

    _, shape = shape_of(str(tiny_model_path), False)
    model = build_model(shape, one_rank_layout, torch.float32, torch.device("cpu"))
    load_hf_weights(model, HfCheckpoint(str(tiny_model_path)), shape, one_rank_layout)
    offload = ModelOffload(model, params=True, grads=False)  # the reference: no DDP, every parameter loose
    total = sum(p.untyped_storage().nbytes() for p in {p.untyped_storage().data_ptr(): p
                                                       for p in model.parameters()}.values())
    assert offload.device_bytes() == total > 0
    offload.park()
    assert offload.device_bytes() == 0 and all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    with offload.resident():
        # the stream's tensors may be the parameters themselves: copied before they are parked again
        back = {name: tensor.clone() for name, tensor in hf_weight_stream(model, shape, one_rank_layout,
                                                                          torch.float32)}
    assert offload.device_bytes() == 0
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).state_dict()
    assert set(back) == {name for name in hf if name != "lm_head.weight"}
    assert all(torch.equal(back[name], hf[name]) for name in back)
