"""The 3-rank half of test_lora.py's one-collective adapter gather: run as
``python -m tests.fsdp.adapter_gather_ranks MODEL`` in three processes with torchrun's variables, on the
CPU (gloo). LoRA rank 2 over 3 ranks shards every lora_A unevenly with one rank's shard empty (rows
1, 1, 0) and lora_B's rows unevenly; each rank checks that ``AdapterGather`` hands out exactly what
``gathered_peft_adapter`` (one ``full_tensor`` per parameter) does, in fp32 and cast to bf16.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from rlcore.testing import build_actor
from rlcore_fsdp.sharding import AdapterGather, gathered_peft_adapter
from tests.fsdp import two_ranks


def main(model_path: str) -> None:
    from rlcore.plugins.manager import get_manager

    manager = get_manager()
    platform = manager.get("platforms", "cpu")()
    settings = {"ppo_mini_batch_size": 8, "lora_rank": 2}
    actor = build_actor(manager.get("training_backends", "fsdp"), two_ranks.config(model_path, settings, False),
                        platform)
    torch.manual_seed(dist.get_rank())  # every rank's shards its own values
    with torch.no_grad():
        for name, param in actor.module.named_parameters():
            if name.endswith((".lora_A", ".lora_B")):
                param.to_local().normal_()
    for dtype in (torch.float32, torch.bfloat16):
        gather = AdapterGather(actor.module, actor.lora, model_path, dtype=dtype, device=torch.device("cpu"))
        assert gather.flat and not gather.apart, (len(gather.flat), len(gather.apart))
        config, tensors = gather()
        expected_config, expected = gathered_peft_adapter(actor.module, actor.lora, model_path, dtype=dtype,
                                                          device=torch.device("cpu"))
        assert config == expected_config, (config, expected_config)
        assert list(tensors) == list(expected)
        for name, tensor in expected.items():
            assert tensors[name].dtype == dtype and tensors[name].is_contiguous(), name
            assert torch.equal(tensors[name], tensor), name
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
