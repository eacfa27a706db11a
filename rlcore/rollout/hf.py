"""The ``hf`` rollout engine: transformers ``generate`` with the actor's own module, colocated with it.

No weight copy and nothing to sync: the engine borrows the actor's (sharded) module through
``Actor.generation_module()``, which gathers its parameters once for the whole generation and
shards them again afterwards. Slower than vLLM/SGLang, but it needs nothing beyond transformers.

Ranks that hold one model between them (Megatron's tensor/pipeline-parallel groups, see
``Actor.generation_group``) generate their pooled prompts together, alike, and each keeps its own
rows. A seeded call (the controller seeds each step) draws the same samples for the same prompts,
however the ranks are laid out.

Input rows (``verl``'s prompt batch): ``input_ids`` (B, P) left-padded and ``attention_mask`` (B, P);
a batch with only ``prompts`` (B, P) is read as left-padded with the tokenizer's pad id.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlcore.batch import Batch
from rlcore.config.schema import JobConfig
from rlcore.errors import RlcoreError
from rlcore.models import load_tokenizer
from rlcore.platforms import Platform
from rlcore.roles import Actor, Rollout, SamplingParams, group_seed
from rlcore.rollout.outputs import group_leader, pool_rows, prompt_tensors


class HfRollout(Rollout):
    def __init__(self, config: JobConfig, platform: Platform, actor: Actor):
        self.config = config
        self.platform = platform
        self.actor = actor
        tokenizer = load_tokenizer(config.model.tokenizer_path or config.model.path,
                                   trust_remote_code=config.model.trust_remote_code)
        self.pad_id = tokenizer.pad_token_id
        self.tokenizer_eos = tokenizer.eos_token_id

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        group = getattr(self.actor, "generation_group", lambda: None)()  # duck-typed actors generate alone
        prompt_ids, prompt_mask, mine = pool_rows(group, *prompt_tensors(prompts, self.pad_id, "hf"), self.pad_id)
        prompt_ids = prompt_ids.repeat_interleave(sampling.n, dim=0)  # (B*n, P), each prompt's n rows in a row
        prompt_mask = prompt_mask.repeat_interleave(sampling.n, dim=0)
        if sampling.seed is not None:
            self.platform.manual_seed(group_seed(sampling.seed, group_leader(group)))
        try:
            borrowed = self.actor.generation_module()
        except NotImplementedError:
            raise RlcoreError(f"the hf rollout engine generates with the actor's own module, and the "
                              f"{type(self.actor).__name__} actor does not lend it; use another engine") from None
        with borrowed as model:
            eos_ids = self._eos_ids(model)
            device = next(model.parameters()).device
            output = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                                    generation_config=self._generation_config(sampling, eos_ids))
        responses = output[:, prompt_ids.shape[1]:].cpu()
        rows = self._assemble(prompt_ids, prompt_mask, responses, sampling.max_new_tokens, eos_ids)
        return rows.select(range(mine.start * sampling.n, mine.stop * sampling.n))

    def release_memory(self) -> None:
        self.platform.empty_cache()

    # -- pieces ----------------------------------------------------------------------------------
    def _eos_ids(self, model) -> list[int]:
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        configured = configured if isinstance(configured, list) else [configured]
        return sorted({i for i in (*configured, self.tokenizer_eos) if i is not None})

    def _generation_config(self, sampling: SamplingParams, eos_ids: list[int]):
        from transformers import GenerationConfig

        common = dict(max_new_tokens=sampling.max_new_tokens, repetition_penalty=1.0, num_return_sequences=1,
                      num_beams=1, eos_token_id=eos_ids, pad_token_id=self.pad_id, use_cache=True)
        if not sampling.do_sample or sampling.temperature == 0:
            return GenerationConfig(do_sample=False, **common)
        # every sampling knob set explicitly: unset ones would come from the model's generation_config
        return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                top_k=max(sampling.top_k, 0), **common)  # top_k 0: off

    def _assemble(self, prompt_ids: Tensor, prompt_mask: Tensor, responses: Tensor, length: int,
                  eos_ids: list[int]) -> Batch:
        """Responses right-padded to ``length``; the mask covers each up to and including its first eos."""
        rows = responses.shape[0]
        if responses.shape[1] < length:
            padding = responses.new_full((rows, length - responses.shape[1]), self.pad_id)
            responses = torch.cat([responses, padding], dim=1)
        responses = responses[:, :length]  # (B, R)
        is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first eos
        response_mask = (~after_eos).long()  # (B, R)
        responses = torch.where(after_eos, self.pad_id, responses)
        prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        steps = torch.arange(1, length + 1, dtype=prompt_positions.dtype)
        response_positions = prompt_positions[:, -1:] + steps  # (B, R)
        return Batch({
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "position_ids": torch.cat([prompt_positions, response_positions], dim=1),
        })
