"""megatron-core's forward on the CPU, for tests/megatron/test_family_forward.py (run as a process of its
own, because it points two of megatron-core's CUDA calls at the CPU for the whole process):

    python -m tests.megatron.cpu_forward DIR FAMILY [FAMILY ...]

For each family of the model-family matrix (tests/families.py) it writes the family's tiny model in DIR,
builds it as the megatron backend does (``build_model`` with the local layer spec, ``load_hf_weights``),
runs the forward with the attention mask rlcore's schedule hands it (``compute.attention_mask``, the
model's sliding window included) and prints one JSON line: the largest difference from transformers'
logits on the same tokens (fp32), and, for a model with a sliding window, the same with the window left
out of the mask (how far off a mask without it is).

megatron-core's forward runs on GPUs only as released: its rotary embedding moves its frequencies to
``torch.cuda.current_device()`` and its attention forks the CUDA RNG tracker around dropout. Here the first
answers "cpu" and the second forks nothing (dropout is off in rlcore's config). Nothing else changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

LENGTH, ROWS = 14, 2
# settings that differ from the family's tiny model: Llama 3.1's own rope band (megatron-core fixes it; the
# family's tiny model uses a smaller one); Phi-3 with a window (Phi-3-mini-4k's is 2047) and half its head
# dimensions rotated (Phi-4-mini rotates three quarters), which the family's tiny Phi-3 leaves at the defaults
SETTINGS = {
    "llama": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "phi3": {"sliding_window": 4, "partial_rotary_factor": 0.5},
}


class _NoCudaRng:
    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()


def megatron_on_the_cpu():
    from megatron.core import parallel_state, tensor_parallel

    torch.cuda.current_device = lambda: "cpu"
    tensor_parallel.get_cuda_rng_tracker = lambda *args, **kwargs: _NoCudaRng()
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(prefix="rlcore-megatron-"), "store"), 1)
    dist.init_process_group(backend="gloo", store=store, rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def compare(family: str, directory: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from rlcore_megatron.compute import attention_mask
    from rlcore_megatron.config_map import MoeSettings
    from rlcore_megatron.model import HfCheckpoint, build_model, current_layout, load_hf_weights, shape_of
    from tests.families import build_family_model

    path = build_family_model(family, directory / family, **SETTINGS.get(family, {}))
    _, shape = shape_of(str(path), False)
    layout, cpu = current_layout(), torch.device("cpu")
    model = build_model(shape, layout, torch.float32, cpu, moe=MoeSettings("allgather"))
    load_hf_weights(model, HfCheckpoint(str(path)), shape, layout)
    model.eval()
    tokens = torch.randint(3, 500, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(LENGTH).expand_as(tokens)
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()(input_ids=tokens).logits

        def difference(window):
            logits = model(input_ids=tokens, position_ids=positions, attention_mask=attention_mask(LENGTH, cpu, window))
            return float((logits - expected).abs().max())

        result = {"family": family, "max_abs_diff": difference(shape.sliding_window),
                  "logit_std": float(expected.std()), "sliding_window": shape.sliding_window}
        if shape.sliding_window is not None:
            result["max_abs_diff_without_the_window"] = difference(None)
    return result


def main(directory: str, *families: str) -> None:
    megatron_on_the_cpu()
    for family in families:
        print(json.dumps(compare(family, Path(directory))), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
