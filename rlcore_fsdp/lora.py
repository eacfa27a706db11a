"""LoRA adapters on the actor (``model.lora_rank``, ``lora_alpha``, ``target_modules``; verl's keys)
and on the critic (the same keys under ``critic.model``; its value head trains whole).

Each targeted ``nn.Linear`` becomes a ``LoraLinear``: the frozen layer as ``base`` plus trainable
``lora_A`` (rank x in) and ``lora_B`` (out x rank), computing ``base(x) + scale * x A^T B^T`` with
``scale = lora_alpha / lora_rank``. ``lora_B`` starts at zero, so the adapted model starts as the
base model (PEFT's initialisation). Only the adapters train: the optimizer, its state and the
gradients hold the adapters alone.

Everything that leaves the actor as a model (weights for a rollout engine, ``rlcore export``) is the
merged ``W + scale * B A`` under the Hugging Face names (``hf_name`` drops ``.base``), so engines
and transformers see a plain model of the base architecture.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import torch
from torch import nn

from rlcore.api import ADAPTER_CONFIG, ADAPTER_WEIGHTS, CriticModelConfig, ModelConfig, RlcoreError

ALL_LINEAR = "all-linear"


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator | None = None):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        bound = 1 / math.sqrt(base.in_features)  # nn.Linear's (and PEFT's) kaiming-uniform with a = sqrt(5)
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound, generator=generator)
        self.disabled = False  # see adapters_disabled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.disabled:
            return self.base(x)
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale

    def extra_repr(self) -> str:
        return f"rank={self.lora_A.shape[0]}, scale={self.scale:g}"


def lora_settings(config: ModelConfig | CriticModelConfig) -> dict | None:
    """``{"rank", "alpha"}`` when LoRA is on, else None (what checkpoints record)."""
    return {"rank": config.lora_rank, "alpha": config.lora_alpha} if config.lora_rank > 0 else None


def add_lora(model: nn.Module, config: ModelConfig | CriticModelConfig, seed: int = 0, *,
             keep_trainable: tuple[str, ...] = (), section: str = "model") -> list[str]:
    """Freeze ``model`` and wrap its targeted linear layers with adapters, in place; returns the
    wrapped layers' names. ``target_modules = "all-linear"`` takes every linear layer but the output
    head (PEFT's meaning); a list takes the layers whose last name part is listed (``q_proj``, ...);
    ``lora_exclude_modules`` leaves out those whose full name matches it (PEFT's ``exclude_modules``).
    Modules named in ``keep_trainable`` (a critic's new value head) stay whole and trainable, as
    PEFT's ``modules_to_save``. The adapters' initial values follow ``seed`` alone, so every rank
    starts from the same ones. ``section`` names the settings in errors."""
    model.requires_grad_(False)
    kept = [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in keep_trainable]
    if keep_trainable and not kept:
        raise RlcoreError(f"{section}.lora_rank: found no value head named {list(keep_trainable)} to train "
                          f"in {type(model).__name__}")
    for module in kept:
        module.requires_grad_(True)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skipped = {id(m) for m in kept} | {id(head)}
    targets, exclude = config.target_modules, config.lora_exclude_modules
    chosen = [(name, module) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and id(module) not in skipped
              and (ALL_LINEAR in targets or name.rsplit(".", 1)[-1] in targets)
              and not (exclude and re.fullmatch(exclude, name))]
    if not chosen:
        found = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise RlcoreError(f"{section}.target_modules = {list(targets)!r} matches no linear layer of "
                          f"{type(model).__name__}; its linear layers are named {found} (or use {ALL_LINEAR!r})")
    generator = torch.Generator().manual_seed(seed)
    for name, linear in chosen:
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, LoraLinear(linear, config.lora_rank, config.lora_alpha, generator))
    return [name for name, _ in chosen]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computing as its base model (the adapters skipped) until the block ends."""
    layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
    for layer in layers:
        layer.disabled = True
    try:
        yield model
    finally:
        for layer in layers:
            layer.disabled = False


def hf_name(name: str) -> str:
    """A parameter's Hugging Face name: a wrapped layer's ``x.base.weight`` is ``x.weight``."""
    return name.replace(".base.", ".")


def with_base(base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An adapted model's full weights from its base model's (Hugging Face names) and what a LoRA
    checkpoint holds (adapters, a critic's value head): a base layer with adapters is ``x.base.*``."""
    adapted = {name[: -len(".lora_A")] for name in trained if name.endswith(".lora_A")}
    full = {}
    for name, tensor in base.items():
        prefix, _, leaf = name.rpartition(".")
        full[f"{prefix}.base.{leaf}" if prefix in adapted else name] = tensor
    return full | trained


def merged_weights(weights: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """Full weights of an adapted model (``...base.weight``, ``...lora_A``, ``...lora_B``) as the
    plain model's, by Hugging Face name: each wrapped weight is ``W + scale * B A``."""
    merged = {}
    for name, tensor in weights.items():
        if name.endswith((".lora_A", ".lora_B")):
            continue
        if name.endswith(".base.weight"):
            prefix = name[: -len(".base.weight")]
            tensor = merge(tensor, weights[f"{prefix}.lora_A"], weights[f"{prefix}.lora_B"], scale)
        merged[hf_name(name)] = tensor
    return merged


def merge(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """``W + scale * B A``, computed in fp32 and returned in ``weight``'s dtype."""
    delta = (lora_b.float() @ lora_a.float()) * scale
    return (weight.float() + delta).to(weight.dtype)


# -- a PEFT adapter to start from (model.lora_adapter_path; verl's model.lora_adapter_path) --------
def with_adapter_settings(config: ModelConfig) -> ModelConfig:
    """``config`` with the rank, alpha and target modules of its ``lora_adapter_path`` (PEFT's
    ``adapter_config.json``); a ``lora_rank`` set to another rank is an error naming both."""
    if config.lora_adapter_path is None:
        return config
    where = f"model.lora_adapter_path = {config.lora_adapter_path!r}"
    path = Path(config.lora_adapter_path).expanduser() / ADAPTER_CONFIG
    try:
        adapter = json.loads(path.read_text())
        rank, alpha, targets = int(adapter["r"]), float(adapter["lora_alpha"]), adapter["target_modules"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RlcoreError(f"{where}: {path} is not a PEFT LoRA adapter config with r, lora_alpha and "
                          f"target_modules ({type(exc).__name__}: {exc})") from None
    if config.lora_rank and config.lora_rank != rank:
        raise RlcoreError(f"{where}: the adapter has rank {rank}, model.lora_rank is {config.lora_rank}: "
                          "leave model.lora_rank unset (0) to take the adapter's")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    exclude = peft_exclude_pattern(adapter.get("exclude_modules"))
    if exclude is not None and config.lora_exclude_modules and config.lora_exclude_modules != exclude:
        raise RlcoreError(f"{where}: the adapter excludes {adapter['exclude_modules']!r}, model.lora_exclude_modules "
                          f"is {config.lora_exclude_modules!r}: leave model.lora_exclude_modules unset to take the "
                          "adapter's")
    return attrs.evolve(config, lora_rank=rank, lora_alpha=alpha, target_modules=targets,
                        lora_exclude_modules=exclude if exclude is not None else config.lora_exclude_modules)


def peft_exclude_pattern(exclude) -> str | None:
    """PEFT's ``exclude_modules`` as ``lora_exclude_modules``'s full-match pattern: a string is one
    already; a list names modules by their full name or its last parts (PEFT matches a list by suffix)."""
    if not exclude:
        return None
    if isinstance(exclude, str):
        return exclude
    return "(?:.*\\.)?(?:" + "|".join(re.escape(name) for name in exclude) + ")"


def load_adapter(model: nn.Module, directory: str) -> None:
    """Copy a PEFT adapter's ``lora_A`` / ``lora_B`` weights into the model's ``LoraLinear`` layers
    (``add_lora`` with ``with_adapter_settings``); every adapted layer must find both, and the
    adapter may hold no others."""
    from safetensors.torch import load_file

    path = Path(directory).expanduser() / ADAPTER_WEIGHTS
    if not path.is_file():
        raise RlcoreError(f"model.lora_adapter_path = {directory!r}: {path} does not exist")
    tensors = {name.removeprefix("base_model.model."): tensor for name, tensor in load_file(str(path)).items()}
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLinear)}
    wanted = {f"{name}.{part}.weight": (layer, part) for name, layer in layers.items()
              for part in ("lora_A", "lora_B")}
    missing, unexpected = sorted(set(wanted) - set(tensors)), sorted(set(tensors) - set(wanted))
    if missing or unexpected:
        raise RlcoreError(f"model.lora_adapter_path = {directory!r}: the adapter does not fit the model's adapted "
                          f"layers; missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected "
                          f"{unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    with torch.no_grad():
        for name, (layer, part) in wanted.items():
            target = getattr(layer, part)
            if tensors[name].shape != target.shape:
                raise RlcoreError(f"model.lora_adapter_path = {directory!r}: {name} has shape "
                                  f"{tuple(tensors[name].shape)}, the model's is {tuple(target.shape)}")
            target.copy_(tensors[name])


# -- the adapter out, as PEFT writes it (``rlcore export --adapter``) ---------------------------------
PEFT_PREFIX = "base_model.model."


def peft_adapter(trained: dict[str, torch.Tensor], model: nn.Module, lora: dict, base_model: str
                 ) -> tuple[dict, dict[str, torch.Tensor]]:
    """(``adapter_config.json``, ``adapter_model.safetensors``) of a LoRA actor: ``trained`` is what its
    checkpoint holds (``x.lora_A`` / ``x.lora_B`` by Hugging Face layer name), ``model`` the base
    architecture (a meta-device skeleton will do), ``lora`` the checkpoint's ``{"rank", "alpha"}``.
    ``target_modules`` lists the adapted layers' last name parts; where that list would also take
    linear layers that carry no adapter (``lora_exclude_modules``, a partial list), those are named in
    ``exclude_modules``, so that PEFT adapts exactly the layers rlcore did."""
    adapted = sorted(name[: -len(".lora_A")] for name in trained if name.endswith(".lora_A"))
    if not adapted:
        raise RlcoreError("this checkpoint holds no LoRA adapters")
    leaves = sorted({name.rsplit(".", 1)[-1] for name in adapted})
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # a wrapped layer's own linear is ``x.base`` (its LoraLinear is ``x``): the layer's name is ``x``
    linear = [name.removesuffix(".base") for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and module is not head]
    missing = sorted(set(adapted) - set(linear))
    if missing:
        raise RlcoreError(f"the checkpoint's adapters do not fit the base model's linear layers: {missing[:3]}")
    left_out = sorted(name for name in linear if name.rsplit(".", 1)[-1] in leaves and name not in set(adapted))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": int(lora["rank"]), "lora_alpha": float(lora["alpha"]), "lora_dropout": 0.0, "bias": "none",
        "target_modules": leaves, "exclude_modules": left_out or None, "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
        "modules_to_save": None,
    }
    tensors = {f"{PEFT_PREFIX}{layer}.{part}.weight": trained[f"{layer}.{part}"].contiguous()
               for layer in adapted for part in ("lora_A", "lora_B")}
    return config, tensors
