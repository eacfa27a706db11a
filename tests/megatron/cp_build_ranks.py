"""One rank of the context-parallel build check, started by ``torchrun --nproc_per_node 2`` on the CPU
(gloo) from ``test_context_parallel.py``: megatron-core's ``GPTModel`` of the tiny Qwen2 folder argv[2]
built by rlcore at context parallel 2; rank 0 writes, as JSON to argv[1], every rank's layout, its
layers' core-attention classes, the members of its model replica and the Hugging Face tensors
streamed back, which the test compares with the folder's."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(out: str, model_path: str) -> None:
    from megatron.core import parallel_state as ps

    from rlcore_megatron.model import (
        HfCheckpoint,
        build_model,
        current_layout,
        hf_weight_stream,
        load_hf_weights,
        model_replica_group,
        shape_of,
    )

    dist.init_process_group("gloo")
    ps.initialize_model_parallel(1, 1, context_parallel_size=2)
    layout = current_layout()
    _, shape = shape_of(model_path, False)
    model = build_model(shape, layout, torch.float32, torch.device("cpu"))
    load_hf_weights(model, HfCheckpoint(model_path), shape, layout)
    streamed = {name: tensor.tolist() for name, tensor in hf_weight_stream(model, shape, layout, torch.float32)}
    mine = {"layout": [layout.context_parallel, layout.cp_rank, layout.data_parallel],
            "core_attention": [f"{type(core).__module__}.{type(core).__name__}"
                               for core in (layer.self_attention.core_attention for layer in model.decoder.layers)],
            "config_cp": model.config.context_parallel_size,
            "replica": dist.get_process_group_ranks(model_replica_group())}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"ranks": everyone, "streamed": streamed}, f)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
