"""One rank of the dist-checkpoint start check, started by ``torchrun`` on the CPU (gloo) from
``test_dist_start.py``.

``write HF_DIR CKPT_DIR [HF_DIR CKPT_DIR ...]`` (one rank): for each pair, a megatron-core distributed checkpoint of the Hugging Face
model with TransformerEngine's sharded keys, laid out as verl's ``scripts/converter_hf_to_mcore.py``
leaves a TE-spec ``GPTModel`` (the layers stacked on a leading axis, query/key/value interleaved per
key/value group, gate and up concatenated, the input and dense pre-MLP norms fused into
``linear_qkv`` and ``linear_fc1``, the experts on an axis of their own), in bfloat16 as verl
converts, plus TransformerEngine's ``_extra_state`` entries. Written from the Hugging Face tensors
directly, not through this backend's conversion.

``load HF_DIR CKPT_DIR TP PP EP OUT [HF_DIR CKPT_DIR TP PP EP OUT ...]``: for each group of six,
megatron-core's layout at tensor-, pipeline- and expert-parallel sizes TP, PP and EP, the backend's
model built from HF_DIR's config and loaded from CKPT_DIR; rank 0 writes, for every Hugging Face
tensor the model gives back, its largest difference from the folder's tensor rounded to bfloat16.

Several checkpoints or layouts go to one process (one after the other, each layout set up and torn
down, the random state as a fresh process has it): each process start costs about 10 s of imports on
the 2-core CI machine, more than a load.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def te_checkpoint(hf: dict[str, torch.Tensor], config, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The sharded state dict verl's converter saves for ``hf`` (a Qwen2/Qwen3/Qwen3-MoE state dict),
    in ``dtype`` (verl converts to bfloat16)."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    layers = config.num_hidden_layers
    heads, groups = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    experts = getattr(config, "num_experts", None)
    state: dict = {}

    def put(key: str, tensor: torch.Tensor, *offsets) -> None:
        state[key] = ShardedTensor.from_rank_offsets(key, tensor.to(dtype).contiguous(), *offsets,
                                                     replica_id=0, prepend_axis_num=len(offsets))

    def per_layer(key: str, tensors: list[torch.Tensor]) -> None:
        for layer, tensor in enumerate(tensors):
            one = f"decoder.layers.{key}"
            state[f"{one}@{layer}"] = ShardedTensor.from_rank_offsets(
                one, tensor.to(dtype).contiguous(), (0, layer, layers), replica_id=0, prepend_axis_num=1)

    put("embedding.word_embeddings.weight", hf["model.embed_tokens.weight"])
    layer = [f"model.layers.{index}." for index in range(layers)]
    per_layer("self_attention.linear_qkv.layer_norm_weight", [hf[p + "input_layernorm.weight"] for p in layer])
    qkv = []
    for p in layer:
        q = hf[p + "self_attn.q_proj.weight"].view(groups, heads // groups * head_dim, -1)
        k = hf[p + "self_attn.k_proj.weight"].view(groups, head_dim, -1)
        v = hf[p + "self_attn.v_proj.weight"].view(groups, head_dim, -1)
        qkv.append(torch.cat([q, k, v], dim=1).reshape(-1, config.hidden_size))
    per_layer("self_attention.linear_qkv.weight", qkv)
    if layer[0] + "self_attn.q_proj.bias" in hf:
        per_layer("self_attention.linear_qkv.bias",
                  [torch.cat([hf[p + "self_attn.q_proj.bias"].view(groups, -1), hf[p + "self_attn.k_proj.bias"]
                              .view(groups, -1), hf[p + "self_attn.v_proj.bias"].view(groups, -1)], 1).reshape(-1)
                   for p in layer])
    if layer[0] + "self_attn.q_norm.weight" in hf:
        per_layer("self_attention.q_layernorm.weight", [hf[p + "self_attn.q_norm.weight"] for p in layer])
        per_layer("self_attention.k_layernorm.weight", [hf[p + "self_attn.k_norm.weight"] for p in layer])
    per_layer("self_attention.linear_proj.weight", [hf[p + "self_attn.o_proj.weight"] for p in layer])
    if experts:
        per_layer("pre_mlp_layernorm.weight", [hf[p + "post_attention_layernorm.weight"] for p in layer])
        per_layer("mlp.router.weight", [hf[p + "mlp.gate.weight"] for p in layer])
        for index, p in enumerate(layer):
            for expert in range(experts):
                e = f"{p}mlp.experts.{expert}."
                offsets = ((0, index, layers), (1, expert, experts))
                fc1 = torch.cat([hf[e + "gate_proj.weight"], hf[e + "up_proj.weight"]])
                for key, tensor in (("mlp.experts.experts.linear_fc1.weight", fc1),
                                    ("mlp.experts.experts.linear_fc2.weight", hf[e + "down_proj.weight"])):
                    state[f"decoder.layers.{key}@{index}.{expert}"] = ShardedTensor.from_rank_offsets(
                        f"decoder.layers.{key}", tensor.to(dtype).contiguous(), *offsets, replica_id=0,
                        prepend_axis_num=2)
    else:
        per_layer("mlp.linear_fc1.layer_norm_weight", [hf[p + "post_attention_layernorm.weight"] for p in layer])
        per_layer("mlp.linear_fc1.weight", [torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
                                            for p in layer])
        per_layer("mlp.linear_fc2.weight", [hf[p + "mlp.down_proj.weight"] for p in layer])
    # TransformerEngine's per-module state (FP8 scaling), which the local spec does not read
    for index in range(layers):
        state[f"extra@{index}"] = ShardedObject("decoder.layers.self_attention.linear_qkv._extra_state",
                                                io.BytesIO(b"te"), (layers,), (index,), replica_id=0)
    put("decoder.final_layernorm.weight", hf["model.norm.weight"])
    if "lm_head.weight" in hf and not config.tie_word_embeddings:
        put("output_layer.weight", hf["lm_head.weight"])
    return state


def cuda_calls_on_cpu() -> None:
    """megatron-core's checkpoint writer calls ``torch.cuda.synchronize()`` before it copies the
    tensors out and puts its one-number failure flag on ``torch.cuda.current_device()``; on a
    CPU-only machine there is nothing to wait for and the flag goes on the CPU (gloo). The backend
    itself runs on GPUs; only this test's writer needs it."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None
        torch.cuda.current_device = lambda: "cpu"


def hf_tensors_of(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def write(hf_dir: str, ckpt_dir: str) -> None:
    from megatron.core import dist_checkpointing
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_dir)
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(te_checkpoint(hf_tensors_of(hf_dir), config), ckpt_dir)


def load(hf_dir: str, ckpt_dir: str, tp: int, pp: int, ep: int, out: str) -> None:
    from megatron.core import parallel_state as ps

    from rlcore_megatron.dist_start import load_dist_weights
    from rlcore_megatron.model import build_model, current_layout, hf_weight_stream, shape_of

    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    layout = current_layout()
    _, shape = shape_of(hf_dir, False)
    model = build_model(shape, layout, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))  # a parameter the load misses shows
    load_dist_weights(model, ckpt_dir, section="actor.megatron")
    back = dict(hf_weight_stream(model, shape, layout, torch.float32))
    if dist.get_rank() == 0:
        hf = hf_tensors_of(hf_dir)
        errors = {name: (tensor - hf[name].to(torch.bfloat16).float()).abs().max().item() if name in hf else None
                  for name, tensor in back.items()}
        with open(out, "w") as f:
            json.dump({"errors": errors, "hf_names": sorted(hf)}, f)
    ps.destroy_model_parallel()


if __name__ == "__main__":
    dist.init_process_group("gloo")
    fresh = torch.random.get_rng_state()
    if sys.argv[1] == "write":
        cuda_calls_on_cpu()
        for index in range(2, len(sys.argv), 2):
            torch.random.set_rng_state(fresh)
            write(sys.argv[index], sys.argv[index + 1])
    else:
        for index in range(2, len(sys.argv), 6):
            torch.random.set_rng_state(fresh)
            hf_dir, ckpt_dir, tp, pp, ep, out = sys.argv[index:index + 6]
            load(hf_dir, ckpt_dir, int(tp), int(pp), int(ep), out)
    dist.destroy_process_group()
