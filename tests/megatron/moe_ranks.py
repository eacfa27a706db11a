"""One rank of the expert-parallel (and pipeline) weight check, started by ``torchrun --nproc_per_node N``
on the CPU (gloo) from ``test_moe.py`` and ``test_pipeline_split.py``: megatron-core's ``GPTModel``
of a Qwen3(-MoE) folder at expert parallel argv[3] (each rank holding its share of the experts), or
at pipeline parallel argv[4] with argv[5] layers on the first stage; rank 0 writes, as JSON to
argv[1], every rank's parameter names and the Hugging Face tensors streamed back, which the test
compares with the folder's."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist


def main(out: str, model_path: str, expert_parallel: int, pipeline_parallel: int, first_stage_layers: int | None
         ) -> None:
    from megatron.core import parallel_state as ps

    from rlcore_megatron.config_map import PipelineSplit
    from rlcore_megatron.model import HfCheckpoint, build_model, current_layout, hf_weight_stream, load_hf_weights
    from rlcore_megatron.model import shape_of

    dist.init_process_group("gloo")
    ps.initialize_model_parallel(1, pipeline_parallel, expert_model_parallel_size=expert_parallel)
    layout = current_layout()
    _, shape = shape_of(model_path, False)
    model = build_model(shape, layout, torch.float32, torch.device("cpu"),
                        split=PipelineSplit(first=first_stage_layers))
    load_hf_weights(model, HfCheckpoint(model_path), shape, layout)
    streamed = {name: tensor.tolist() for name, tensor in hf_weight_stream(model, shape, layout, torch.float32)}
    names = [None] * dist.get_world_size()
    dist.all_gather_object(names, [name for name, _ in model.named_parameters()])
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"layout": [layout.expert_parallel, layout.ep_rank], "names": names, "streamed": streamed}, f)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 1,
         int(sys.argv[5]) if len(sys.argv) > 5 else None)
