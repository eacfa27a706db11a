"""``[data]``: the prompt files and how prompts are batched, cut and rendered. ``rlcore.config``
assembles it into ``JobConfig``."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.plugins.settings import setting


@attrs.frozen
class DataConfig:
    train_files: tuple[str, ...] = setting((), doc="verl-schema parquet file(s)")
    val_files: tuple[str, ...] = setting((), doc="verl-schema parquet file(s)")
    prompt_key: str = setting("prompt")
    image_key: str = setting("images", doc="the column of a row's images, a list of {bytes, path}, one per image "
                                           "placeholder in the prompt (verl's schema; docs/multimodal.md)")
    train_batch_size: int = setting(1024, ge=1, doc="prompts per step")
    val_batch_size: int | None = setting(None, ge=1, doc="None: the whole validation set")
    max_prompt_length: int = setting(512, ge=1)
    max_response_length: int = setting(512, ge=1)
    filter_overlong_prompts: bool = setting(False, doc="drop prompts over max_prompt_length (counted)")
    truncation: str = setting("error", choices=("error", "left", "right"),
                              doc="what to do with a long prompt that is not filtered")
    apply_chat_template_kwargs: dict[str, Any] | None = setting(
        None, doc="more arguments of the tokenizer's apply_chat_template when prompts are rendered (e.g. "
                  "enable_thinking, reasoning_effort)")
    shuffle: bool = setting(True)
    seed: int = setting(1, ge=0, lt=2**63, doc="shuffling seed (0 to 2**63 - 1)")
