"""A reward model: a sequence-classification model (one label) that scores each conversation, as
verl's reward-model worker (``reward_model.enable``). It replaces the reward functions: a response's
score is the model's output for the prompt's messages followed by the response as the assistant's turn.

It runs in every hybrid worker on that worker's share of the batch, as a whole transformers model in
``model.dtype`` (no sharding: a reward model must fit on one device), inference only.
"""

from __future__ import annotations

import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.models.loading import load_tokenizer, quiet_loading, resolve_dtype, resolve_model_path
from rlcore.rewards.config import RewardModelConfig
from rlcore.runtime.distributed import local_device
from rlcore.runtime.platforms import Platform


class RewardModel:
    def __init__(self, options: RewardModelConfig, platform: Platform, *, policy_tokenizer: str, dtype: str):
        """``options``: the job's ``reward.model``; ``policy_tokenizer``: the policy's tokenizer
        (``model.tokenizer_path`` or ``model.path``), for responses given as token ids; ``dtype``:
        ``model.dtype``."""
        from transformers import AutoConfig, AutoModelForSequenceClassification

        if not options.path:
            raise RlcoreError("reward.model.enable needs reward.model.path (verl: reward_model.model.path)")
        path = resolve_model_path(options.path)
        self.options, self.device = options, local_device(platform)
        self.policy_tokenizer_path = policy_tokenizer
        self._policy_tokenizer = None
        self.tokenizer = load_tokenizer(options.input_tokenizer or path, trust_remote_code=options.trust_remote_code,
                                        padding_side="right")
        model_config = AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code)
        if getattr(model_config, "num_labels", 1) != 1:
            raise RlcoreError(f"reward.model.path = {options.path!r} has {model_config.num_labels} labels; a reward "
                              "model has one (its output is the score)")
        if model_config.pad_token_id is None:  # transformers pools at the last token that is not padding
            model_config.pad_token_id = self.tokenizer.pad_token_id
        try:
            with quiet_loading():
                model = AutoModelForSequenceClassification.from_pretrained(
                    path, config=model_config, dtype=resolve_dtype(dtype, platform),
                    trust_remote_code=options.trust_remote_code)
        except ValueError as exc:
            raise RlcoreError(f"reward.model.path = {options.path!r} is no sequence-classification model ({exc})") \
                from None
        self.model = model.to(self.device).eval().requires_grad_(False)

    def conversation(self, messages: list[dict], response: str) -> str:
        """The text the model scores: the chat template over the prompt and the response (plain
        concatenation for a tokenizer without a template)."""
        turns = [*messages, {"role": "assistant", "content": response}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(turns, tokenize=False)
        return "\n".join(turn["content"] for turn in turns)

    def responses(self, batch: Batch) -> list[str]:
        """The policy's responses as text: the ``response`` rows when given, else decoded here, in the
        worker, from ``responses`` and ``response_mask`` (the policy's token ids) with the policy's
        tokenizer; the reward model then reads them through its own chat template."""
        if "response" in batch:
            return list(batch["response"])
        if self._policy_tokenizer is None:
            self._policy_tokenizer = load_tokenizer(resolve_model_path(self.policy_tokenizer_path))
        return self._policy_tokenizer.batch_decode(
            [ids[mask.bool()] for ids, mask in zip(batch["responses"], batch["response_mask"])],
            skip_special_tokens=True)

    @torch.no_grad()
    def score(self, batch: Batch) -> Batch:
        """``rm_scores`` (B,) fp32 for rows with ``raw_prompt`` (chat messages) and the responses
        (``responses``)."""
        texts = [self.conversation(list(m), r) for m, r in zip(batch["raw_prompt"], self.responses(batch))]
        step = self.options.micro_batch_size_per_gpu or max(len(texts), 1)
        scores = []
        for start in range(0, len(texts), step):
            encoded = self.tokenizer(texts[start:start + step], return_tensors="pt", padding=True,
                                     truncation=self.options.max_length is not None,
                                     max_length=self.options.max_length, add_special_tokens=False)
            logits = self.model(input_ids=encoded["input_ids"].to(self.device),
                                attention_mask=encoded["attention_mask"].to(self.device)).logits  # (b, 1)
            scores.append(logits[:, 0].float().cpu())
        return Batch({"rm_scores": torch.cat(scores) if scores else torch.zeros(0)})
