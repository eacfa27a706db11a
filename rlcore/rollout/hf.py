"""The ``hf`` rollout engine: transformers ``generate`` with the actor's own module, colocated with it.

No weight copy and nothing to sync: the engine borrows the actor's (sharded) module through
``Actor.generation_module()``, which gathers its parameters once for the whole generation and
shards them again afterwards. Slower than a dedicated inference engine, but it needs nothing beyond
transformers.

Ranks that hold one model between them (a model-parallel backend's tensor/pipeline groups, see
``Actor.generation_group``) generate their pooled prompts together, alike, and each keeps its own
rows. A seeded call (the controller seeds each step) draws the same samples for the same prompts,
however the ranks are laid out.

Besides the rows every engine returns, ``rollout_log_probs`` (B, R): each sampled token's log-prob
under the distribution it was drawn from (after temperature, top-k and top-p; greedy: the raw
logits), as inference engines report their processed log-probs; 0 after the response's end.

With ``rollout.return_routed_experts`` (a mixture of experts, for ``actor.router_replay = "R3"``), also
``routed_experts`` (B, P+R, L, K): the experts each MoE layer's router chose for each position as the
engine forwarded it (the prompt in one forward, then each sampled token the step after), -1 at pads and at
each response's last token, which no step forwards (``rlcore.models.routing``).

Input rows (``verl``'s prompt batch): ``input_ids`` (B, P) left-padded and ``attention_mask`` (B, P);
a batch with only ``prompts`` (B, P) is read as left-padded with the tokenizer's pad id. Rows of a
vision-language model's prompts carry ``multi_modal_inputs`` (``rlcore.data.vision``): generation takes
their pixel values and image grids (the model computes its 3-D rotary positions from them).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from rlcore.batch import Batch
from rlcore.data.vision import MULTI_MODAL_INPUTS, image_model_inputs
from rlcore.errors import RlcoreError
from rlcore.metrics.step import Timer
from rlcore.models.loading import load_tokenizer
from rlcore.models.routing import NOT_RECORDED, ModelRouting, generated_column
from rlcore.rollout.outputs import ROLLOUT_TIMING, group_leader, pool_rows, prompt_tensors, response_rows
from rlcore.runtime.platforms import Platform
from rlcore.training.roles import Actor, Rollout, SamplingParams, group_seed

# RolloutSpec (rlcore.training.specs) is named in hints, never imported: the specs are made from the configuration,
# which stands above this component.


class HfRollout(Rollout):
    def __init__(self, spec: RolloutSpec, platform: Platform, actor: Actor):
        """``spec``: what the driver computed for the engine; it reads its ``rollout`` and ``model`` tables."""
        rollout = spec.rollout
        asked = [f"rollout.{name} = {getattr(rollout, name)!r}" for name, plain in (
            ("data_parallel_size", 1), ("expert_parallel_size", 1), ("quantization", None))
            if getattr(rollout, name) != plain]
        if asked:
            raise RlcoreError(f"{', '.join(asked)}: the hf rollout engine generates with the actor's own module, "
                              "laid out and typed as the actor trains it; pick an inference engine in rollout.name "
                              "(`rlcore plugins` lists them) or leave these at their defaults")
        self.rollout_config = rollout
        self.platform = platform
        self.actor = actor
        tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path,
                                   trust_remote_code=spec.model.trust_remote_code)
        self.pad_id = tokenizer.pad_token_id
        self.tokenizer_eos = tokenizer.eos_token_id

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        group = self.actor.generation_group()
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
        from transformers import LogitsProcessorList

        recorder = SampledLogProbs() if self.rollout_config.calculate_log_probs else None
        processors = [*sampling_warpers(sampling), *([recorder] if recorder else [])]
        timer = Timer()
        routed = None
        with timer("engine"), borrowed as model:
            eos_ids = self._eos_ids(model)
            device = next(model.parameters()).device
            routing = ModelRouting(model) if self.rollout_config.return_routed_experts else None
            images = self._image_inputs(prompts, group, sampling.n, prompt_ids, model, device)
            try:
                with routing.recording() if routing else nullcontext() as records:
                    output = model.generate(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device),
                                            **images,
                                            generation_config=self._generation_config(sampling, eos_ids),
                                            logits_processor=LogitsProcessorList(processors))
                if routing:
                    routed = generated_column(records, len(prompt_ids), prompt_ids.shape[1] + sampling.max_new_tokens)
            finally:
                if routing:
                    routing.remove()
        with timer("rows"):
            returned = self._returned(output[:, prompt_ids.shape[1]:].cpu(), sampling.max_new_tokens, eos_ids)
            log_probs = None
            if recorder is not None:
                log_probs = [row[:len(ids)] for row, ids in zip(recorder.result(output).cpu().tolist(), returned)]
            rows = response_rows(prompt_ids, prompt_mask, returned, log_probs, sampling.max_new_tokens, self.pad_id)
            if routed is not None:
                rows = rows.update(Batch({"routed_experts": _unforwarded_cleared(routed, rows["attention_mask"])}))
            rows = rows.select(range(mine.start * sampling.n, mine.stop * sampling.n))
        return Batch(rows.tensors, rows.rows, rows.meta | {ROLLOUT_TIMING: timer.seconds})

    def release_memory(self) -> None:
        self.platform.empty_cache()

    # -- pieces ----------------------------------------------------------------------------------
    @staticmethod
    def _image_inputs(prompts: Batch, group, n: int, prompt_ids: Tensor, model, device) -> dict[str, Tensor]:
        """The images of the prompts' rows (``multi_modal_inputs``), each prompt's n times, as the model's
        ``generate`` takes them; none for text-only prompts."""
        if MULTI_MODAL_INPUTS not in prompts.rows or not any(prompts[MULTI_MODAL_INPUTS]):
            return {}
        if group is not None:
            raise RlcoreError("the hf rollout engine does not generate with images on model-parallel ranks that "
                              "pool their prompts (an actor whose generation_group() is a group); images need a "
                              "backend whose ranks each hold the whole model")
        rows = [row for row in prompts[MULTI_MODAL_INPUTS] for _ in range(n)]
        return image_model_inputs(rows, prompt_ids, model, device)

    def _eos_ids(self, model) -> list[int]:
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        configured = configured if isinstance(configured, list) else [configured]
        return sorted({i for i in (*configured, self.tokenizer_eos) if i is not None})

    def _generation_config(self, sampling: SamplingParams, eos_ids: list[int]):
        from transformers import GenerationConfig

        common = dict(max_new_tokens=sampling.max_new_tokens, repetition_penalty=1.0, num_return_sequences=1,
                      num_beams=1, eos_token_id=eos_ids, pad_token_id=self.pad_id, use_cache=True)
        if not greedy(sampling):
            # sampling with no warpers of transformers' own: ``sampling_warpers`` passes them, before the
            # recorder of log-probs (transformers would add its own after every custom processor)
            return GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, **common)
        return GenerationConfig(do_sample=False, **common)

    def _returned(self, responses: Tensor, length: int, eos_ids: list[int]) -> list[list[int]]:
        """Each row's tokens as the engine returned them: through its first eos, at most ``length``."""
        responses = responses[:, :length]
        is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
        ended = is_eos.any(dim=1)
        ends = torch.where(ended, is_eos.int().argmax(dim=1) + 1, responses.shape[1])  # (B,)
        return [row[:end] for row, end in zip(responses.tolist(), ends.tolist())]


def _unforwarded_cleared(routed: Tensor, attention_mask: Tensor) -> Tensor:
    """The engine's (B, P+R, L, K) routing with -1 at pads and at each row's last token (sampled, never
    forwarded; a row that ended early was forwarded past its end along with the others)."""
    real = attention_mask.bool().clone()
    last = attention_mask.shape[1] - 1 - attention_mask.flip(1).int().argmax(dim=1)  # (B,) the last real column
    real[torch.arange(len(real)), last] = False
    return routed.masked_fill(~real[:, :, None, None], NOT_RECORDED)


def greedy(sampling: SamplingParams) -> bool:
    return not sampling.do_sample or sampling.temperature == 0


def sampling_warpers(sampling: SamplingParams) -> list:
    """Temperature, top-k and top-p as transformers applies them when it samples (none when greedy)."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    if greedy(sampling):
        return []
    warpers = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature != 1.0 else []
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    return warpers


class SampledLogProbs:
    """The last logits processor: keeps each step's log-softmax of the scores the token is drawn from
    (after temperature, top-k and top-p: an inference engine's processed log-probs) and reads off the chosen
    token's when the next step shows which it was. Holds one (rows, vocabulary) fp32 tensor at a time."""

    def __init__(self):
        self.pending: Tensor | None = None
        self.columns: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.pending is not None:
            self.columns.append(self.pending.gather(1, input_ids[:, -1:]))
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def result(self, sequences: Tensor) -> Tensor:
        """(rows, generated) log-probs of the generated tokens of ``sequences`` (prompt + output)."""
        columns = list(self.columns)
        if self.pending is not None:
            columns.append(self.pending.gather(1, sequences[:, -1:].to(self.pending.device)))
        if not columns:
            return torch.zeros(sequences.shape[0], 0)
        return torch.cat(columns, dim=1)
