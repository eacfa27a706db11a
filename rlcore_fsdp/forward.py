"""Forward passes over (prompt + response) rows: response log-probs, entropy, values.

Two layouts give the same numbers: padded rows (B, P + R) as the rollout hands them over, or, with
``model.use_remove_padding``, the micro-batch's real tokens packed into one row (``packing``), which
spends no compute on padding. Either way only the logits that predict response tokens are computed
(``logits_to_keep``) and turned into fp32, one micro-batch at a time, so at most one micro-batch's
(response tokens, vocab) logits exist at once.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlcore.api import (
    MULTI_MODAL_INPUTS,
    Batch,
    RlcoreError,
    StudentTopK,
    image_model_inputs,
    images_in_prompts_only,
    prompt_image_mask,
    student_top_k,
    sum_pi_squared_from_logits,
    takes_token_types,
    to_device,
    token_log_probs,
    top_k_log_probs,
)
from rlcore_fsdp import ulysses
from rlcore_fsdp.packing import PackedRows, pack


def _padded_inputs(batch: Batch, device: torch.device, model: nn.Module | None = None) -> dict[str, Tensor]:
    """The model's inputs for padded rows; rows with images (``multi_modal_inputs``) add the images and
    leave the positions to the model, which computes its 3-D rotary positions from them (Qwen2-VL)."""
    inputs = {key: to_device(batch[key], device) for key in ("input_ids", "attention_mask", "position_ids")}
    if MULTI_MODAL_INPUTS in batch.rows:
        images = image_model_inputs(batch[MULTI_MODAL_INPUTS], batch["input_ids"], model, device,
                                    prompt_width=_prompt_width(batch))
        if images:
            inputs.pop("position_ids")
            inputs |= images
    return inputs


def _prompt_width(batch: Batch) -> int | None:
    """The width of the batch's (left-padded) prompts before its responses; None for rows without responses."""
    return batch["input_ids"].shape[1] - batch["responses"].shape[1] if "responses" in batch.tensors else None


def _image_mask(inputs: dict[str, Tensor]) -> Tensor | None:
    """Where the images go among the forward's ids (the prompts' image tokens), or None without images."""
    marks = inputs.get("mm_token_type_ids")
    return None if marks is None else marks.bool()


def _keeps_logits(model: nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _response_logits(model: nn.Module, batch: Batch, device: torch.device, packed: bool
                     ) -> tuple[Tensor, Tensor, PackedRows | None]:
    """The logits that predict the batch's response tokens and those tokens: (N, V) and (N,) packed
    (with the packed rows, whose ``unpack`` lays (N, ...) values out as (B, R, ...)), else (B, R, V) and
    (B, R) (and None)."""
    if packed:
        rows = pack(batch, device)
        images, image_mask = _packed_image_inputs(model, batch, device)
        with images_in_prompts_only(model, image_mask):
            logits = model(**(rows.model_inputs() | images), use_cache=False,
                           logits_to_keep=rows.predictors).logits[0]  # (N, V)
        return logits, rows.targets, rows
    response_length = batch["responses"].shape[1]
    inputs = _padded_inputs(batch, device, model)
    with images_in_prompts_only(model, _image_mask(inputs)):
        if _keeps_logits(model):
            logits = model(**inputs, use_cache=False, logits_to_keep=response_length + 1).logits
        else:
            logits = model(**inputs, use_cache=False).logits[:, -response_length - 1:]
    # position t predicts token t + 1: the last R + 1 positions' first R predict the R responses
    return logits[:, :-1], to_device(batch["responses"], device), None  # (B, R, V), (B, R)


def _laid_out(values: Tensor | None, rows: PackedRows | None) -> Tensor | None:
    """Per-token values as (B, R, ...): unpacked when the logits were packed."""
    return values if values is None or rows is None else rows.unpack(values)


def log_probs_and_entropy(model: nn.Module, batch: Batch, device: torch.device, temperature: float,
                          with_entropy: bool, *, entropy_grad: bool = False, packed: bool = False,
                          sp_group: dist.ProcessGroup | None = None, with_sum_pi_squared: bool = False
                          ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Per-token log-probs (B, R) of the batch's responses, at the sampling temperature (the
    distribution the tokens were drawn from, as verl), and, if asked, the entropy (B, R) and the sum
    of the squared probabilities (B, R, without a graph; ``actor.calculate_sum_pi_squared``); the
    entropy keeps its graph only with ``entropy_grad`` (an entropy bonus), else it is a metric.
    Packed, the values where a response has no token are 0. With an SP group (packed only), the
    packed row is split over its ranks (``ulysses``)."""
    if packed and sp_group is not None:
        refuse_packed_images(batch)
        return ulysses.log_probs_and_entropy(model, pack(batch, device), temperature, with_entropy, entropy_grad,
                                             sp_group, with_sum_pi_squared=with_sum_pi_squared)
    logits, targets, rows = _response_logits(model, batch, device, packed)
    log_probs, entropy = token_log_probs(logits, targets, temperature, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad)
    squares = _sum_pi_squared(logits, temperature) if with_sum_pi_squared else None
    return _laid_out(log_probs, rows), _laid_out(entropy, rows), _laid_out(squares, rows)


def teacher_log_probs_and_top_k(model: nn.Module, batch: Batch, device: torch.device, temperature: float, k: int,
                                *, packed: bool = False, sp_group: dist.ProcessGroup | None = None
                                ) -> dict[str, Tensor]:
    """The teacher's outputs under ``distillation.loss = forward_kl_topk``: ``ref_log_prob`` (B, R) at the
    sampled tokens, and at each response position its k most likely tokens, ``ref_topk_ids`` (B, R, K)
    and their log-probs ``ref_topk_log_probs`` (B, R, K); zero where a response has no token. With an SP
    group (packed only), the packed row is split over its ranks."""
    if packed and sp_group is not None:
        refuse_packed_images(batch)
        return ulysses.teacher_log_probs_and_top_k(model, pack(batch, device), temperature, k, sp_group)
    logits, targets, rows = _response_logits(model, batch, device, packed)
    log_probs, _ = token_log_probs(logits, targets, temperature, with_entropy=False)
    top_log_probs, top_ids = top_k_log_probs(logits, k, temperature)
    return {"ref_log_prob": _laid_out(log_probs, rows), "ref_topk_ids": _laid_out(top_ids, rows),
            "ref_topk_log_probs": _laid_out(top_log_probs, rows)}


def student_log_probs_at_teacher_top_k(model: nn.Module, batch: Batch, device: torch.device, temperature: float,
                                       teacher_ids: Tensor, *, entropy_grad: bool = False, packed: bool = False,
                                       sp_group: dist.ProcessGroup | None = None
                                       ) -> tuple[Tensor, Tensor, StudentTopK]:
    """The actor's forward under the top-k loss: log-probs and entropy (B, R) as ``log_probs_and_entropy``,
    and its log-probs at the teacher's ``teacher_ids`` (B, R, K) with their graph (``StudentTopK``)."""
    if packed and sp_group is not None:
        refuse_packed_images(batch)
        rows = pack(batch, device)
        return ulysses.student_log_probs_at_teacher_top_k(model, rows, temperature,
                                                          rows.at_responses(to_device(teacher_ids, device)),
                                                          entropy_grad,
                                                          sp_group)
    logits, targets, rows = _response_logits(model, batch, device, packed)
    log_probs, entropy = token_log_probs(logits, targets, temperature, with_entropy=True, entropy_grad=entropy_grad)
    ids = to_device(teacher_ids, device)
    at_teacher, overlap = student_top_k(logits, ids if rows is None else rows.at_responses(ids), temperature)
    return (_laid_out(log_probs, rows), _laid_out(entropy, rows),
            StudentTopK(log_probs=_laid_out(at_teacher, rows), overlap=_laid_out(overlap, rows)))


def _sum_pi_squared(logits: Tensor, temperature: float) -> Tensor:
    """sum_v pi_v^2 (...) of (..., V) logits at the sampling temperature, without a graph."""
    with torch.no_grad():
        return sum_pi_squared_from_logits(logits.float() / temperature)


def response_values(model: nn.Module, batch: Batch, device: torch.device, *, packed: bool = False,
                    sp_group: dist.ProcessGroup | None = None) -> Tensor:
    """Value-head outputs (B, R) fp32 for the state before each response token (as verl)."""
    if packed:
        rows = pack(batch, device)
        if sp_group is not None:
            return ulysses.response_values(model, rows, sp_group)
        values = model(**rows.model_inputs(), use_cache=False).logits[0, :, 0]  # (T,)
        return rows.unpack(values[rows.predictors].float())
    response_length = batch["responses"].shape[1]
    values = model(**_padded_inputs(batch, device, model), use_cache=False).logits  # (B, P + R, 1)
    return values[:, -response_length - 1:-1, 0].float()


def refuse_packed_images(batch: Batch) -> None:
    """Ulysses splits a packed row over ranks; with images each rank would need the whole images: not built."""
    if MULTI_MODAL_INPUTS in batch.rows and any(batch[MULTI_MODAL_INPUTS]):
        raise RlcoreError("*.ulysses_sequence_parallel_size > 1 splits packed rows over ranks, which rlcore does not "
                          "do for rows with images yet: set it to 1 for a vision-language model")


_PACKING_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _packed_image_inputs(model: nn.Module, batch: Batch, device: torch.device
                         ) -> tuple[dict[str, Tensor], Tensor | None]:
    """For a packed micro-batch with images: the images, and the rows' 3-D rotary positions (3, 1, T) as the
    model computes them for each padded row (``get_rope_index``), packed as the tokens are; and where the
    images go among the packed tokens (1, T), the prompts' image tokens. The packing boundaries must reach
    the language model's attention only: the vision tower, which transformers hands the same keyword
    arguments, attends within each image (``_shield_vision_tower``)."""
    images = _padded_inputs(batch, device, model)
    if "pixel_values" not in images:
        return {}, None
    inner = model.model if hasattr(model.model, "get_rope_index") else model
    marks = prompt_image_mask(images["input_ids"], model.config.image_token_id, _prompt_width(batch))
    token_types = {"mm_token_type_ids": marks.int()} if takes_token_types(inner.get_rope_index) else {}
    positions, _ = inner.get_rope_index(images["input_ids"], image_grid_thw=images["image_grid_thw"],
                                        attention_mask=images["attention_mask"], **token_types)  # (3, B, L)
    real = images["attention_mask"].bool()
    _shield_vision_tower(inner)
    return ({"position_ids": positions[:, real].unsqueeze(1),  # (3, 1, T)
             "pixel_values": images["pixel_values"], "image_grid_thw": images["image_grid_thw"]},
            marks[real].unsqueeze(0))


def _shield_vision_tower(inner: nn.Module) -> None:
    """Drop the packing keywords on their way into ``get_image_features`` (once per model)."""
    if getattr(inner, "_rlcore_shielded", False):
        return
    features = inner.get_image_features

    def get_image_features(pixel_values, image_grid_thw=None, **kwargs):
        return features(pixel_values, image_grid_thw, **{k: v for k, v in kwargs.items() if k not in _PACKING_KEYS})

    inner.get_image_features = get_image_features
    inner._rlcore_shielded = True


def sampling_temperature(temperature: float) -> float:
    """The temperature log-probs are computed at; greedy (0) means the plain distribution."""
    return temperature if temperature > 0 else 1.0
