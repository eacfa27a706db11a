"""The actor's weights by Hugging Face names: for the engines (weight sync), for the ``hf`` engine's
module and for the Hugging Face folder of a checkpoint. torchtitan's own state-dict adapter
(``Llama3StateDictAdapter.to_hf``) renames them and undoes its permutation of the query and key rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def hf_weights(module: nn.Module, adapter, dtype: torch.dtype, device: torch.device
               ) -> Iterator[tuple[str, Tensor]]:
    """Every weight of torchtitan's (sharded) ``module`` whole, by its Hugging Face name, in ``dtype`` on
    ``device``, one at a time (a collective per weight: every rank iterates the same way). A tied
    output layer is left out, as Hugging Face folders leave it out."""
    for name, tensor in module.state_dict().items():
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        for hf_name, value in adapter.to_hf({name: whole.detach()}).items():
            yield hf_name, value.to(device=device, dtype=dtype)


def load_hf_weights(model: nn.Module, weights: Iterable[tuple[str, Tensor]]) -> None:
    """Copy Hugging Face-named ``weights`` into a transformers ``model``; every parameter must be among
    them (a tied output layer shares the embedding's)."""
    state = model.state_dict()
    seen = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"{type(model).__name__} has no weight {name!r}")
            state[name].copy_(tensor)
            seen.add(name)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = {name for name, _ in model.named_parameters()} - seen - tied
    if missing:
        raise KeyError(f"weights missing for {sorted(missing)}")


class GenerationModule:
    """A transformers model of the actor's config that the ``hf`` engine generates with, holding the
    actor's weights as of the last time it was lent after an update (``stale``)."""

    def __init__(self, hf_config, dtype: torch.dtype, device: torch.device):
        self.hf_config, self.dtype, self.device = hf_config, dtype, device
        self.model: nn.Module | None = None
        self.stale = True

    @contextmanager
    def lent(self, weights: Callable[[], Iterable[tuple[str, Tensor]]]):
        if self.model is None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_config(self.hf_config, dtype=self.dtype).to(self.device)
            self.model.requires_grad_(False)
            self.model.eval()
        if self.stale:
            load_hf_weights(self.model, weights())
            self.stale = False
        yield self.model
