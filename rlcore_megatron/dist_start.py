"""A role's starting weights from a megatron-core distributed checkpoint (verl's
``megatron.use_dist_checkpointing`` with ``dist_checkpointing_path``), in place of the Hugging Face
folder's; ``model.path`` still gives the config and the tokenizer.

verl writes such checkpoints with ``scripts/converter_hf_to_mcore.py``: a ``GPTModel`` of
TransformerEngine's layer spec, its ``sharded_state_dict()`` saved by ``dist_checkpointing.save``.
Its sharded keys stack the layers on a leading axis (``decoder.layers.self_attention.linear_qkv.weight``,
the layer number in the offsets) and name the norms TransformerEngine fuses into the next matrix:

| this backend's local layer spec             | TransformerEngine's layer spec                           |
|---------------------------------------------|----------------------------------------------------------|
| ``input_layernorm.weight``                  | ``self_attention.linear_qkv.layer_norm_weight``           |
| ``pre_mlp_layernorm.weight`` (dense MLP)    | ``mlp.linear_fc1.layer_norm_weight``                      |
| ``pre_mlp_layernorm.weight`` (MoE layer)    | ``pre_mlp_layernorm.weight`` (a norm of its own)          |
| ``mlp.experts.local_experts.N.linear_fc*``  | ``mlp.experts.experts.linear_fc*`` with an expert axis:   |
| (``SequentialMLP``)                         | ``SequentialMLP`` and ``TEGroupedMLP`` write the same     |

The other keys (embedding, query/key norms, ``linear_proj``, ``linear_fc2``, router, final norm,
output layer) are the same in both. megatron-core's local spec already renames the two dense-layer
norms (its ``sharded_state_dict_keys_map``), for the MoE layers too, where TransformerEngine's spec
keeps ``pre_mlp_layernorm``: this module renames that one back. The checkpoint's extra entries
(TransformerEngine's ``_extra_state``, FP8 metadata) are not read.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rlcore.api import RlcoreError

LOCAL_SPEC_MOE_NORM = "mlp.linear_fc1.layer_norm_weight"  # megatron-core's local spec renames it for every layer
TE_MOE_NORM = "pre_mlp_layernorm.weight"


def te_sharded_state_dict(model: nn.Module, prefix: str = "") -> dict:
    """``model``'s sharded state dict with the keys verl's TransformerEngine checkpoints carry, each
    key behind ``prefix`` (verl's ``dist_checkpointing_prefix``, e.g. NeMo 2's ``module.``)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.transformer.moe.moe_layer import MoELayer

    sharded = model.sharded_state_dict(prefix=prefix)
    moe_layers = {f"{prefix}decoder.layers.{index}." for index, layer in enumerate(model.decoder.layers)
                  if isinstance(layer.mlp, MoELayer)} if hasattr(model, "decoder") else set()
    for name, entry in sharded.items():
        if not isinstance(entry, ShardedTensor):
            continue
        moe = any(name.startswith(layer) for layer in moe_layers)
        if moe and entry.key.endswith(LOCAL_SPEC_MOE_NORM) and name.endswith("pre_mlp_layernorm.weight"):
            entry.key = entry.key[:-len(LOCAL_SPEC_MOE_NORM)] + TE_MOE_NORM
    return sharded


def _saved_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The global shape of every tensor of the checkpoint at ``path``, by sharded key."""
    from megatron.core import dist_checkpointing

    saved = dist_checkpointing.load_tensors_metadata(str(path))
    return {key: tuple(tensor.global_shape) for key, tensor in saved.items()}


def load_dist_weights(model: nn.Module, path: str, *, section: str, prefix: str = "",
                      skip: tuple[str, ...] = ()) -> None:
    """Every parameter of this rank's stage of ``model`` from the distributed checkpoint at ``path``,
    resharded by megatron-core to this rank's tensor-, pipeline- and expert-parallel share and cast to
    the parameter's dtype. Parameters whose state-dict name starts with one of ``skip`` are left as
    they are (a critic's new value head). A key the checkpoint lacks, or holds in another global
    shape (another model, another vocabulary padding), is an error naming ``section``'s keys."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    folder = Path(path)
    where = f"{section}.dist_checkpointing_path = {str(path)!r}"
    if not (folder / "metadata.json").is_file():
        raise RlcoreError(f"{where}: not a megatron-core distributed checkpoint (it has no metadata.json); give the "
                          "folder verl's converter (scripts/converter_hf_to_mcore.py) wrote")
    # the tensors only: per-module extra state (_extra_state: FP8 scaling, TransformerEngine's own) stays unread
    sharded = {name: entry for name, entry in te_sharded_state_dict(model, prefix).items()
               if isinstance(entry, (ShardedTensor, ShardedTensorFactory))
               and not (skip and name[len(prefix):].startswith(skip))}
    _check_keys(sharded, _saved_shapes(folder), where, prefix)
    loaded = dist_checkpointing.load(sharded, str(folder), strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, tensor in loaded.items():
            target = params.get(name[len(prefix):], buffers.get(name[len(prefix):]))
            if isinstance(tensor, torch.Tensor) and target is not None and tensor is not target:
                target.copy_(tensor)
    unfilled = [name for name in params if f"{prefix}{name}" not in sharded
                and not (skip and name.startswith(skip)) and not _is_tied_copy(model, name)]
    if unfilled:
        raise RlcoreError(f"{where}: megatron-core gave no checkpoint entry for the parameters "
                          f"{', '.join(unfilled[:5])}; this backend cannot start from it")


def _is_tied_copy(model: nn.Module, name: str) -> bool:
    """The last stage's output layer when it shares the embedding's weights (loaded under the
    embedding's key)."""
    return name == "output_layer.weight" and getattr(model, "share_embeddings_and_output_weights", False)


def _check_keys(sharded: dict, saved: dict[str, tuple[int, ...]], where: str, prefix: str) -> None:
    """Each tensor this rank asks for is in the checkpoint, in the same global shape."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    for name, entry in sharded.items():
        if isinstance(entry, ShardedTensorFactory):
            entries = entry.build()
            entries = entries if isinstance(entries, list) else list(entries.values()) \
                if isinstance(entries, dict) else [entries]
        else:
            entries = [entry]
        for each in entries:
            if not isinstance(each, ShardedTensor):
                continue
            if each.key not in saved:
                prefixed = not any(key.startswith(f"{prefix}decoder.") for key in saved)
                hint = (f" (its keys start with {sorted(saved)[0]!r}: set dist_checkpointing_prefix to the part "
                        "before 'decoder.')") if saved and prefixed else ""
                raise RlcoreError(f"{where}: the checkpoint has no tensor {each.key!r} (for {name}){hint}")
            if tuple(each.global_shape) != saved[each.key]:
                raise RlcoreError(f"{where}: {each.key!r} is saved with global shape {saved[each.key]}, this model "
                                  f"holds {tuple(each.global_shape)}: the checkpoint is of another model (or was "
                                  "converted with another vocabulary padding); give model.path the Hugging Face "
                                  "folder it was converted from")
