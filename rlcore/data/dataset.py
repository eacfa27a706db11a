"""``PromptDataset`` reads verl-schema parquet and tokenizes prompts through the chat template;
``PromptLoader`` serves seeded, resumable batches of them as left-padded ``Batch``es. A row's images
(verl's ``images`` column, ``data.image_key``) are checked and carried as encoded bytes
(``rlcore.data.images``)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rlcore.batch import Batch
from rlcore.data.config import DataConfig
from rlcore.data.images import row_images
from rlcore.data.vision import MULTI_MODAL_INPUTS, VisionPrompts, fit_prompt
from rlcore.errors import RlcoreError

logger = logging.getLogger(__name__)
REQUIRED_COLUMNS = ("data_source", "reward_model")
# verl's video and audio columns (its data.video_key and audio_key defaults): rlcore reads images only,
# so a row that carries videos or audio is refused rather than trained on its text alone
MEDIA_COLUMNS = ("videos", "audios")


def read_columns(path: Path, split: str, prompt_key: str) -> tuple[list[str], str | None]:
    """A data file's column names, read from its parquet schema alone, and what is wrong with them
    (not parquet, or a required column missing), or None."""
    import pyarrow.parquet as pq

    try:
        present = pq.read_schema(path).names
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not parquet
        return [], f"{split} data file {path} is not a readable parquet file: {exc}"
    missing = [c for c in (prompt_key, *REQUIRED_COLUMNS) if c not in present]
    if missing:
        return present, (f"{split} data file {path} has no column {', '.join(map(repr, missing))} "
                         f"(data.prompt_key = {prompt_key!r}); its columns: {', '.join(present)}")
    return present, None


def _expand(files: str | os.PathLike | Sequence[str | os.PathLike], split: str) -> list[Path]:
    """The parquet files named (a folder stands for the ``*.parquet`` files in it)."""
    names = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not names:
        raise RlcoreError(f"no {split} data files given (data.{split}_files)")
    paths: list[Path] = []
    for name in names:
        path = Path(name).expanduser()
        if path.is_dir():
            found = sorted(path.glob("*.parquet"))
            if not found:
                raise RlcoreError(f"{split} data folder {path} holds no .parquet files")
            paths.extend(found)
        elif path.is_file():
            paths.append(path)
        else:
            raise RlcoreError(f"{split} data file {path} does not exist")
    return paths


def _messages(value: Any, where: str) -> list[dict]:
    """Chat messages from a prompt cell; a plain string becomes one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return [dict(m) for m in value]
    raise RlcoreError(f"{where}: the prompt must be a non-empty list of {{role, content}} chat messages, "
                      f"got {str(value)[:120]!r}")


def _refuse_media(path: Path, split: str, column: str, cells: list) -> None:
    """A media column may be there, empty (a text-only row of a mixed verl dataset); a row with media is
    refused, naming it."""
    for index, cell in enumerate(cells):
        if cell:
            raise RlcoreError(f"{split} data file {path}, row {index}: column {column!r} holds {column} "
                              f"({len(cell) if isinstance(cell, (list, tuple)) else 1}); rlcore reads images "
                              "(data.image_key) but not videos or audio: remove these rows or the column")


class PromptDataset:
    """Prompts of one split: one or many verl-schema parquet files, tokenized, long prompts handled.

    ``num_filtered``: prompts dropped for being longer than ``data.max_prompt_length`` (text tokens:
    an image's tokens are the model's to count). ``has_images``: some row carries images.

    With ``vision`` (a vision-language model's ``VisionPrompts``), a row's images are put into its
    prompt: its ids hold the image tokens (which count towards ``data.max_prompt_length`` and are never
    truncated) and the row carries the model's image inputs (``multi_modal_inputs``). Without it the
    images are read and checked, and the prompt is its text alone (what the checks and a job that
    cannot train on images need).
    """

    def __init__(self, files: str | os.PathLike | Sequence[str | os.PathLike], tokenizer,
                 data_config: DataConfig, split_name: str = "train", vision: VisionPrompts | None = None):
        self.split = split_name
        self.vision = vision  # a vision-language model's prompt encoder: rows with images need one
        self.config = data_config
        self.files = _expand(files, split_name)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise RlcoreError("the tokenizer has neither a pad token nor an eos token to pad prompts with")
        self.num_filtered = 0
        self.input_ids: list[torch.Tensor] = []  # one (P_i,) tensor per prompt, no padding
        self.rows: list[dict[str, Any]] = []
        total = 0
        for path in self.files:
            records = self._read(path)
            total += len(records)
            self._add(path, records, tokenizer)
        if self.num_filtered:
            logger.warning("%s data: dropped %d of %d prompts longer than data.max_prompt_length = %d tokens",
                           split_name, self.num_filtered, total, data_config.max_prompt_length)
        self.has_images = any(row["images"] for row in self.rows)
        if not self.rows:
            raise RlcoreError(f"no {split_name} prompts left in {', '.join(map(str, self.files))} "
                              f"({total} read, {self.num_filtered} longer than data.max_prompt_length dropped)")

    def _read(self, path: Path) -> list[dict]:
        import pyarrow.parquet as pq

        present, problem = read_columns(path, self.split, self.config.prompt_key)
        if problem:
            raise RlcoreError(problem)
        key = self.config.prompt_key
        columns = [key, *REQUIRED_COLUMNS] + (["extra_info"] if "extra_info" in present else [])
        columns += [self.config.image_key] if self.config.image_key in present else []
        media = [column for column in MEDIA_COLUMNS if column in present and column not in columns]
        try:
            table = pq.read_table(path, columns=columns + media)
        except Exception as exc:  # noqa: BLE001 - a damaged page shows only when its data is read
            raise RlcoreError(f"{self.split} data file {path} could not be read (a damaged parquet file?): "
                              f"{type(exc).__name__}: {exc}") from None
        for column in media:
            _refuse_media(path, self.split, column, table.column(column).to_pylist())
        return table.select(columns).to_pylist()

    def _add(self, path: Path, records: list[dict], tokenizer) -> None:
        limit, image_key = self.config.max_prompt_length, self.config.image_key
        prompts, texts, encoded = [], [], []  # encoded: a row's ids when they came with its images
        for index, record in enumerate(records):
            where = f"{self.split} data file {path}, row {index}"
            messages = _messages(record[self.config.prompt_key], where)
            if not isinstance(record["data_source"], str):
                raise RlcoreError(f"{where}: data_source is {record['data_source']!r} "
                                  f"({type(record['data_source']).__name__}); expected text naming the reward "
                                  "function, e.g. 'openai/gsm8k'")
            # a file without the image column is text-only: an "<image>" in its text is text, as in verl
            images = (row_images(record[image_key], messages, path.parent, where, image_key)
                      if image_key in record else [])
            reward_model = record["reward_model"]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise RlcoreError(f"{where}: reward_model has no ground_truth (got {reward_model!r})")
            try:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                     **(self.config.apply_chat_template_kwargs or {}))
            except Exception as exc:  # noqa: BLE001 - a missing template or a template error, named with the row
                raise RlcoreError(
                    f"{where}: the tokenizer's chat template failed: {type(exc).__name__}: {exc}") from None
            prompt = {"data_source": record["data_source"], "ground_truth": reward_model["ground_truth"],
                      "extra_info": record.get("extra_info") or {}, "raw_prompt": messages,
                      "images": images, "file": str(path), "row": index}
            if images and self.vision is not None:  # through the model's image processor: ids with image tokens
                ids, prompt[MULTI_MODAL_INPUTS] = self.vision.encode(
                    messages, images, where, self.config.apply_chat_template_kwargs)
                encoded.append(ids)
            else:
                texts.append(text)
                encoded.append(None)
            prompts.append(prompt)
        if not prompts:
            return
        text_ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
        for prompt, ids in zip(prompts, encoded):
            text_only = ids is None
            ids = next(text_ids) if text_only else ids
            if len(ids) > limit:
                if self.config.filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                if self.config.truncation == "error":
                    raise RlcoreError(
                        f"{self.split} data file {path}, row {prompt['row']}: the prompt is {len(ids)} tokens, "
                        f"longer than data.max_prompt_length = {limit}. Raise data.max_prompt_length, set "
                        "data.filter_overlong_prompts = true to drop such prompts, or data.truncation = "
                        "\"left\" or \"right\" to cut them.")
                if text_only:
                    ids = ids[-limit:] if self.config.truncation == "left" else ids[:limit]
                else:  # never through an image
                    ids = fit_prompt(ids, limit, self.vision.image_token_id, self.config.truncation,
                                     f"{self.split} data file {path}, row {prompt['row']}")
            self.input_ids.append(torch.tensor(ids, dtype=torch.long))
            self.rows.append(prompt)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        """A prompt: ``input_ids`` (P_i,) and its data_source, ground_truth, extra_info, raw_prompt, images."""
        return {"input_ids": self.input_ids[index], **self.rows[index]}

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Every prompt once, in file order, in batches of ``batch_size`` (the last may be smaller): validation."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        for start in range(0, len(self), batch_size):
            yield collate(self, range(start, min(start + batch_size, len(self))), epoch=0)


def collate(dataset: PromptDataset, indices: Sequence[int], epoch: int) -> Batch:
    """Left-pad the prompts at ``indices`` into one ``Batch``; with images, the rows carry ``images`` (a
    list of encoded images per prompt, in placeholder order) and ``multi_modal_inputs`` (the model's
    image inputs, ``rlcore.data.vision``; None for a text-only row)."""
    prompts = [dataset.input_ids[i] for i in indices]
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), dataset.pad_token_id, dtype=torch.long)  # (B, P)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, P)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = ids
        attention_mask[row, width - len(ids):] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # (B, P)
    rows = [dataset.rows[i] for i in indices]
    return Batch(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        rows={
            "data_source": [r["data_source"] for r in rows],
            "ground_truth": [r["ground_truth"] for r in rows],
            "extra_info": [r["extra_info"] for r in rows],
            "raw_prompt": [r["raw_prompt"] for r in rows],
            "uid": [f"{dataset.split}-{i}-e{epoch}" for i in indices],
        } | ({"images": [r["images"] for r in rows],
              MULTI_MODAL_INPUTS: [r.get(MULTI_MODAL_INPUTS) for r in rows]} if dataset.has_images else {}),
    )


class PromptLoader:
    """Batches of a ``PromptDataset``, epoch after epoch, in an order fixed by ``seed`` and the epoch.

    Iterating yields the rest of the current epoch, then moves to the next one; ``next_batch()``
    hands out one batch at a time across epochs. Both advance the same position. ``state_dict()``
    taken after a batch was handed out resumes, through ``load_state_dict()``, at the batch after it.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, shuffle: bool = True, seed: int = 1,
                 drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # batches of this epoch already handed out
        self._cached_order: tuple[int, list[int]] = (-1, [])
        if len(self) == 0:
            raise RlcoreError(f"the {dataset.split} data has {len(dataset)} prompts, fewer than one batch of "
                              f"{batch_size} (data.{dataset.split}_batch_size): lower it or add prompts")

    def __len__(self) -> int:
        """Batches per epoch."""
        size = len(self.dataset)
        return size // self.batch_size if self.drop_last else math.ceil(size / self.batch_size)

    def order(self, epoch: int) -> list[int]:
        """The prompt order of an epoch: the same for the same seed and epoch, whatever came before."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        if self._cached_order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._cached_order = (epoch, torch.randperm(len(self.dataset), generator=generator).tolist())
        return self._cached_order[1]

    def _roll_over(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[Batch]:
        self._roll_over()  # a previous pass stopped right after the last batch
        epoch, order = self.epoch, self.order(self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1  # counted before the batch is used, so a checkpoint taken now resumes after it
            yield collate(self.dataset, order[start:start + self.batch_size], epoch)
        self._roll_over()

    def next_batch(self) -> Batch:
        """The next batch, moving on to the next epoch when this one is done."""
        self._roll_over()
        order = self.order(self.epoch)
        start = self.position * self.batch_size
        self.position += 1
        return collate(self.dataset, order[start:start + self.batch_size], self.epoch)

    def state_dict(self) -> dict[str, int]:
        epoch, position = (self.epoch + 1, 0) if self.position >= len(self) else (self.epoch, self.position)
        return {"epoch": epoch, "position": position, "num_prompts": len(self.dataset),
                "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        changed = [f"{key} {state[key]} -> {now}" for key, now in
                   (("num_prompts", len(self.dataset)), ("batch_size", self.batch_size), ("seed", self.seed))
                   if key in state and state[key] != now]
        if changed:
            logger.warning("%s data changed since the checkpoint (%s): resuming at epoch %d, batch %d "
                           "will not continue the same order", self.dataset.split, "; ".join(changed),
                           state["epoch"], state["position"])
        self.epoch = int(state["epoch"])
        self.position = min(int(state["position"]), len(self))
