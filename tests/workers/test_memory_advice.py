"""A step that runs out of device memory names the keys that bound its memory (on an 80 GB H100 the GSM8K
example's update ran out of it with a message that named none), in process and under Ray alike."""

import pytest
import torch

from rlcore.workers.group import WorkerError, describe_failure, memory_advice
from rlcore.workers.local import LocalWorkerGroup

OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.12 GiB. GPU 0 has a total capacity of 79.18 GiB")


class WorkerOutOfMemory:
    """A worker whose every step runs out of device memory, as a CUDA allocation past the device's."""

    def execute(self, method, *args):
        return getattr(self, method)(*args), 0.0

    def update_actor(self, batch):
        raise OOM

    def compute_values(self, batch):
        raise ValueError("a bug, not memory")


def in_process_group() -> LocalWorkerGroup:
    group = LocalWorkerGroup.__new__(LocalWorkerGroup)  # the group without building a model
    group.name, group.worker = "hybrid", WorkerOutOfMemory()
    return group


def test_an_update_out_of_memory_in_process_names_the_keys_to_lower():
    with pytest.raises(WorkerError) as raised:
        in_process_group().dispatch("update_actor", None)
    message = str(raised.value)
    assert message.startswith("hybrid worker rank 0 failed during actor step 'update_actor': OutOfMemoryError: CUDA")
    assert ("The device ran out of memory: lower actor.ppo_max_token_len_per_gpu (the tokens of a micro-batch with "
            "actor.use_dynamic_bsz) or actor.ppo_micro_batch_size_per_gpu or rollout.gpu_memory_utilization (the "
            "inference engine's share of each device), or set model.enable_gradient_checkpointing = true.") in message
    assert "the last checkpoint is intact" in message and raised.value.__cause__ is OOM


def test_other_errors_in_process_pass_as_they_are():
    with pytest.raises(ValueError, match="a bug, not memory"):
        in_process_group().dispatch("compute_values", None)


def test_a_ray_worker_out_of_memory_in_the_reference_pass_names_its_keys():
    message = describe_failure("hybrid", "compute_ref_log_prob", 1, "failed", OOM)
    assert "rank 1 failed during reference step 'compute_ref_log_prob'" in message
    assert "lower ref.log_prob_max_token_len_per_gpu or ref.log_prob_micro_batch_size_per_gpu or " \
           "rollout.gpu_memory_utilization" in message
    assert memory_advice("generate", OOM) == (" The device ran out of memory: lower rollout.gpu_memory_utilization "
                                              "(the inference engine's share of each device).")
    assert memory_advice("update_actor", RuntimeError("CUDA error: illegal address")) == ""


def test_two_engines_beside_the_trainer_are_named_when_a_weight_sync_runs_out_of_memory():
    """On an 80 GB H100 two engines (15 GB each) beside a 1.5B trainer (49 GB) left no room for a weight sync
    (2026-12-07); the message named only rollout.gpu_memory_utilization, not the second engine's copy."""
    message = describe_failure("rollout", "receive_weights", 1, "failed", OOM, engines_on_device=2)
    assert "rank 1 failed during weight sync step 'receive_weights'" in message
    assert ("The device ran out of memory: lower async_training.engines_per_device (2 engine processes share each "
            "device, each with its own copy of the weights) or rollout.gpu_memory_utilization") in message
    assert "engines_per_device" not in describe_failure("rollout", "receive_weights", 0, "failed", OOM,
                                                        engines_on_device=1)
