"""The vision-language tests' shared pieces: a job on the tiny model, its prompts, a plain forward."""

from __future__ import annotations

import attrs
import torch

from rlcore.batch import Batch
from rlcore.data.dataset import PromptDataset, collate
from rlcore.data.vision import MULTI_MODAL_INPUTS, VisionPrompts
from rlcore.models.loading import load_tokenizer
from tests.fsdp.helpers import job

RESPONSE_LENGTH = 6


def vlm_job(model_path, *, max_prompt_length: int = 128, **kwargs):
    config = job(model_path, **kwargs)
    return attrs.evolve(config, data=attrs.evolve(config.data, max_prompt_length=max_prompt_length,
                                                  max_response_length=RESPONSE_LENGTH))


def prompt_dataset(model_path, files, config=None, split: str = "train") -> PromptDataset:
    config = config or vlm_job(model_path)
    tokenizer = load_tokenizer(str(model_path))
    return PromptDataset(files, tokenizer, config.data, split, VisionPrompts(str(model_path), tokenizer))


def with_responses(prompts: Batch, seed: int = 0, vocab: int = 49000) -> Batch:
    """The prompts followed by random responses of different lengths, as the rollout hands rows over."""
    g = torch.Generator().manual_seed(seed)
    rows = len(prompts)
    responses = torch.randint(3, vocab, (rows, RESPONSE_LENGTH), generator=g)
    response_mask = torch.ones(rows, RESPONSE_LENGTH, dtype=torch.long)
    for row in range(rows):
        response_mask[row, RESPONSE_LENGTH - row % 3:] = 0
    responses = torch.where(response_mask.bool(), responses, 0)
    attention_mask = torch.cat([prompts["attention_mask"], response_mask], 1)
    tensors = {"prompts": prompts["input_ids"], "responses": responses, "response_mask": response_mask,
               "input_ids": torch.cat([prompts["input_ids"], responses], 1), "attention_mask": attention_mask,
               "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0)}
    return Batch(tensors, prompts.rows)


def rows_of(dataset: PromptDataset, indices) -> Batch:
    return with_responses(collate(dataset, list(indices), epoch=0))


def plain_log_probs(model_path, batch: Batch) -> torch.Tensor:
    """Response log-probs (B, R) from a plain transformers forward of the model class with the rows' images
    (the image-token marks a processor returns; the model computes its 3-D rotary positions)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    images = batch[MULTI_MODAL_INPUTS]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       pixel_values=torch.cat([row["pixel_values"] for row in images]),
                       image_grid_thw=torch.cat([row["image_grid_thw"] for row in images]),
                       mm_token_type_ids=(batch["input_ids"] == model.config.image_token_id).int()).logits
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1].float(), dim=-1)  # (B, R, V)
    chosen = log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return chosen * batch["response_mask"]


def log_probs_with_text_image_tokens(model_path, batch: Batch) -> torch.Tensor:
    """Response log-probs (B, R) where only the prompts' image tokens take the image features: an image token
    in a response (one the policy sampled) is embedded as text at a text position, as the engine did when
    it sampled it. Built by hand from the model's parts (its embedding, vision tower, 3-D positions), apart
    from rlcore's forward."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
    inner, ids, attention = model.model, batch["input_ids"], batch["attention_mask"]
    marks = ids == model.config.image_token_id
    marks[:, ids.shape[1] - RESPONSE_LENGTH:] = False
    images = batch[MULTI_MODAL_INPUTS]
    pixels = torch.cat([row["pixel_values"] for row in images])
    grid = torch.cat([row["image_grid_thw"] for row in images])
    with torch.no_grad():
        embeds = inner.get_input_embeddings()(ids)
        features = torch.cat(inner.get_image_features(pixels, grid, return_dict=True).pooler_output)
        embeds = embeds.masked_scatter(marks.unsqueeze(-1).expand_as(embeds), features)
        positions, _ = inner.get_rope_index(ids, image_grid_thw=grid, attention_mask=attention,
                                            mm_token_type_ids=marks.int())
        logits = model(inputs_embeds=embeds, attention_mask=attention, position_ids=positions).logits
    log_probs = torch.log_softmax(logits[:, -RESPONSE_LENGTH - 1:-1].float(), dim=-1)
    return log_probs.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1) * batch["response_mask"]
