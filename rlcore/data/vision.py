"""A vision-language model's prompts: messages with images into token ids and the model's image inputs.

A model folder with a ``preprocessor_config.json`` (Qwen2-VL's, Qwen2.5-VL's image processor) is a
vision-language model's. Its prompts go through the tokenizer's chat template, which writes one
image-pad token per image (``<|image_pad|>``, the model config's ``image_token_id``); rlcore then widens
each to the image's tokens (its patch grid divided by the merge size squared), as transformers' processor
does, and carries the image processor's ``pixel_values`` (patches, C*T*P*P) and ``image_grid_thw``
(images, 3) per row, in the batch's ``multi_modal_inputs`` (verl's name). rlcore does this itself rather
than through transformers' ``AutoProcessor``, which also wants a video processor, and that needs
torchvision (which some inference engines' CPU builds uninstall); the image processor's Pillow path needs only Pillow.

Truncation never cuts an image's tokens: only text tokens are dropped, and a row whose image tokens
alone pass ``data.max_prompt_length`` is refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from rlcore.data.images import decode, processor_messages
from rlcore.errors import RlcoreError

MULTI_MODAL_INPUTS = "multi_modal_inputs"  # per-row key: {"pixel_values": (N_i, D), "image_grid_thw": (I_i, 3)}
IMAGE_PAD = "<|image_pad|>"
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def image_processor_file(path: str) -> Path | None:
    """The model's image processor settings, ``preprocessor_config.json`` (``path``: a folder, or a hub id in
    the Hugging Face cache, as ``resolve_model_path`` gives them), or None."""
    if Path(path).is_dir():
        file = Path(path) / PREPROCESSOR_CONFIG
        return file if file.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, PREPROCESSOR_CONFIG)
    return Path(cached) if isinstance(cached, str) else None


def has_image_processor(path: str) -> bool:
    """Whether the model has an image processor's settings: a vision-language model's."""
    return image_processor_file(path) is not None


class VisionPrompts:
    """Encodes prompts with images for one model: its tokenizer, image processor and image token."""

    def __init__(self, path: str, tokenizer, *, trust_remote_code: bool = False):
        from transformers import AutoImageProcessor

        self.tokenizer = tokenizer
        self.image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.image_token_id = image_token_id(path, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
        self.image_token = tokenizer.convert_ids_to_tokens(self.image_token_id)
        self.merge = int(getattr(self.image_processor, "merge_size", 1))
        self.path = path

    def encode(self, messages: Sequence[dict], images: Sequence[bytes], where: str,
               chat_template_kwargs: dict | None = None) -> tuple[list[int], dict[str, Tensor]]:
        """The prompt's token ids (the image tokens widened) and its ``multi_modal_inputs``."""
        text = self.tokenizer.apply_chat_template(processor_messages(messages, images), add_generation_prompt=True,
                                                  tokenize=False, **(chat_template_kwargs or {}))
        if text.count(self.image_token) != len(images):
            raise RlcoreError(f"{where}: the chat template of {self.path} wrote {text.count(self.image_token)} "
                              f"{self.image_token} token(s) for {len(images)} image(s); it must place one per image")
        processed = self.image_processor(images=[decode(data) for data in images], return_tensors="pt")
        grid = processed["image_grid_thw"]  # (I, 3)
        pieces = text.split(self.image_token)
        widened = pieces[0]
        for count, piece in zip((grid.prod(dim=-1) // self.merge ** 2).tolist(), pieces[1:]):
            widened += self.image_token * count + piece
        ids = self.tokenizer(widened, add_special_tokens=False)["input_ids"]
        return ids, {"pixel_values": processed["pixel_values"], "image_grid_thw": grid}


def fit_prompt(ids: list[int], limit: int, image_token_id: int, side: str, where: str) -> list[int]:
    """``ids`` cut to ``limit`` tokens by dropping text tokens from the ``side`` ("left" or "right") only:
    an image's tokens are never cut; a prompt whose image tokens alone pass the limit is refused."""
    images = sum(1 for i in ids if i == image_token_id)
    if images > limit:
        raise RlcoreError(f"{where}: the prompt's images are {images} tokens, more than data.max_prompt_length = "
                          f"{limit}; truncation never cuts an image, so raise data.max_prompt_length or make the "
                          "images smaller (the image processor's max_pixels)")
    excess = len(ids) - limit
    order = range(len(ids)) if side == "left" else range(len(ids) - 1, -1, -1)
    dropped = set()
    for index in order:
        if len(dropped) == excess:
            break
        if ids[index] != image_token_id:
            dropped.add(index)
    return [token for index, token in enumerate(ids) if index not in dropped]


def image_token_id(path: str, *, tokenizer=None, trust_remote_code: bool = False) -> int | None:
    """The image token of the vision-language model at ``path`` (its config's ``image_token_id``, else its
    tokenizer's ``<|image_pad|>``: ``tokenizer``, or the one at ``path``); None for a model without an image
    processor."""
    if not has_image_processor(path):
        return None
    from transformers import AutoConfig

    token_id = getattr(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code), "image_token_id", None)
    if token_id is None:
        if tokenizer is None:
            from rlcore.models.loading import load_tokenizer

            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
        token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    return token_id


def one_token_per_image(ids: Sequence[int], image_token: int) -> list[int]:
    """``ids`` with each run of image tokens narrowed to one: the prompt as the chat template wrote it, before
    each image was widened to its tokens (an engine that widens them itself takes this form; given
    the widened form it would widen the first token of each run again)."""
    return [token for index, token in enumerate(ids)
            if token != image_token or index == 0 or ids[index - 1] != image_token]


def image_model_inputs(rows: Sequence[dict | None], input_ids: Tensor, model, device: torch.device,
                       prompt_width: int | None = None) -> dict[str, Tensor]:
    """What a Qwen2-VL-style ``model``'s forward takes besides the ids, for rows (B,) of ``multi_modal_inputs``
    (None for a text-only row): the rows' ``pixel_values`` and ``image_grid_thw`` one after the other, and,
    where the forward takes them (transformers 5), ``mm_token_type_ids`` (B, T) marking the image tokens,
    from which the model computes its 3-D rotary positions (so no ``position_ids`` are passed with them).
    ``prompt_width``: the ids are prompts of that width followed by responses, and only the prompts' image
    tokens are an image's (``prompt_image_mask``). Empty when no row has an image."""
    present = [row for row in rows if row and len(row["image_grid_thw"])]
    if not present:
        return {}
    inputs = {"pixel_values": torch.cat([row["pixel_values"] for row in present]).to(device),
              "image_grid_thw": torch.cat([row["image_grid_thw"] for row in present]).to(device)}
    if takes_token_types(model.forward):
        inputs["mm_token_type_ids"] = prompt_image_mask(input_ids, model.config.image_token_id,
                                                        prompt_width).int().to(device)
    return inputs


def prompt_image_mask(input_ids: Tensor, image_token: int, prompt_width: int | None = None) -> Tensor:
    """(B, T) True at the image tokens of the prompts (the first ``prompt_width`` columns; None: all). An image
    token in a response is a token the policy sampled, which the engine embedded as text: so must the
    trainer, at its text position (``images_in_prompts_only``)."""
    mask = input_ids == image_token
    if prompt_width is not None:
        mask[:, prompt_width:] = False
    return mask


@contextmanager
def images_in_prompts_only(model, image_mask: Tensor | None):
    """Within the block, a Qwen2-VL-style ``model`` puts the image features at ``image_mask``'s positions only
    (its shape the forward's ``input_ids``'), where transformers takes every image token of the ids: a
    response may hold an image token the policy sampled (a random or young model does), and with it
    transformers would count more image tokens than the images have ("Image features and image tokens do not
    match"). The model's ``get_placeholder_mask`` is wrapped once; outside the block it is transformers' own."""
    inner = getattr(model, "model", model)
    if image_mask is None or not hasattr(inner, "get_placeholder_mask"):
        yield
        return
    if not getattr(inner, "_rlcore_prompt_images", False):
        original = inner.get_placeholder_mask

        def get_placeholder_mask(input_ids, inputs_embeds, image_features=None, video_features=None):
            mask = getattr(inner, "_rlcore_image_mask", None)
            if mask is None or image_features is None:
                return original(input_ids, inputs_embeds=inputs_embeds, image_features=image_features,
                                video_features=video_features)
            if int(mask.sum()) * inputs_embeds.shape[-1] != image_features.numel():
                raise RlcoreError(f"the prompts hold {int(mask.sum())} image tokens, their images "
                                  f"{image_features.shape[0]} features")
            return mask.unsqueeze(-1).expand_as(inputs_embeds).to(inputs_embeds.device), None

        inner.get_placeholder_mask = get_placeholder_mask
        inner._rlcore_prompt_images = True
    inner._rlcore_image_mask = image_mask
    try:
        yield
    finally:
        inner._rlcore_image_mask = None


def takes_token_types(function) -> bool:
    """Whether a transformers function takes ``mm_token_type_ids`` (transformers 5's Qwen2-VL does; 4.x's
    finds the image tokens by their id)."""
    import inspect

    return "mm_token_type_ids" in inspect.signature(function).parameters


def refuse_untrainable_images(datasets: Sequence, gaps: Sequence[str]) -> None:
    """Stop a job whose prompts carry images, before any worker starts, when what training with them needs
    is missing (``gaps``: each said to the user), rather than train on the text with the images dropped."""
    for dataset in datasets:
        if dataset is None or not dataset.has_images or not gaps:
            continue
        row = next(r for r in dataset.rows if r["images"])
        raise RlcoreError(
            f"the {dataset.split} data carries images ({row['file']}, row {row['row']}: {len(row['images'])} in "
            f"column {dataset.config.image_key!r}), but {'; '.join(gaps)}. Training with images needs a "
            "vision-language model and an engine and a backend that take them (docs/multimodal.md)")
