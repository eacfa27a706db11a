"""A model of the rollout's own, for an engine that generates with an actor's module (``hf``) where
no actor is at hand (a rollout worker of the asynchronous mode, in either form): it lends its module as
an actor would and takes new weights by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlcore.errors import RlcoreError
from rlcore.models.loading import load_causal_lm, resolve_dtype


class InferenceCopy:
    def __init__(self, config, platform):
        model = config.model
        self.module = load_causal_lm(model.path, resolve_dtype(model.dtype, platform),
                                     trust_remote_code=model.trust_remote_code, override_config=model.override_config)
        self.device = platform.device(0)
        self.module.to(self.device).eval()
        self.module.requires_grad_(False)
        # every name of every tensor, tied ones too (an actor sends a tied tensor once, under one name)
        self.tensors = dict(self.module.state_dict(keep_vars=True))

    @contextmanager
    def generation_module(self):
        with torch.no_grad():
            yield self.module

    def generation_group(self):
        return None  # generates its own share alone

    def load(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> int:
        """Copy the sent tensors into the module, by Hugging Face name; returns how many came."""
        count = 0
        with torch.no_grad():
            for bucket in buckets:
                for name, tensor in bucket:
                    target = self.tensors.get(name)
                    if target is None or target.shape != tensor.shape:
                        what = "no such tensor" if target is None else f"shape {tuple(target.shape)}"
                        raise RlcoreError(f"the rollout's copy of {self.module.__class__.__name__} cannot take "
                                          f"{name} {tuple(tensor.shape)} from the trainer ({what}); the actor and "
                                          "the rollout must load the same model.path")
                    target.copy_(tensor.to(target.device, target.dtype))
                    count += 1
        return count
