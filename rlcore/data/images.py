"""Images in verl's multimodal rows, read and checked with Pillow.

verl's schema (``examples/data_preprocess/geo3k.py``, ``verl/utils/dataset/rl_dataset.py``): the
column named by ``data.image_key`` (default ``images``) holds a list of ``{"bytes", "path"}`` entries
per row, and each ``<image>`` in the prompt messages' text stands for the next image of that list, in
order. A row's images are checked when the data is loaded, before any training: each decodes, each
path exists, and the placeholders and the images are as many. Every error names the file and the row.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError

PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(PLACEHOLDER)})")


def placeholder_count(messages: Sequence[dict]) -> int:
    """How many ``<image>`` placeholders the messages' text holds."""
    return sum(m["content"].count(PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))


def entry_bytes(entry: Any, folder: Path, where: str) -> bytes:
    """The encoded image of one entry: its ``bytes``, else the file at its ``path`` (relative paths from
    the parquet file's folder); a plain string is a path."""
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, dict):
        raise RlcoreError(f"{where}: expected an image as {{'bytes': ..., 'path': ...}}, got "
                          f"{type(entry).__name__}")
    if entry.get("bytes") is not None:
        data = entry["bytes"]
        if not isinstance(data, (bytes, bytearray)):
            raise RlcoreError(f"{where}: its bytes are {type(data).__name__}, expected binary image data")
        return bytes(data)
    if not entry.get("path"):
        raise RlcoreError(f"{where}: has neither bytes nor a path")
    path = Path(entry["path"]).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise RlcoreError(f"{where}: its path {entry['path']!r} does not exist (looked for {path})")
    return path.read_bytes()


def pillow():
    """The ``PIL.Image`` module, or an error saying how to install Pillow."""
    try:
        from PIL import Image
    except ImportError:
        raise RlcoreError("images need Pillow, which is not installed: pip install 'rlcore[vision]' "
                          "(or pip install pillow)") from None
    return Image


def decode(data: bytes):
    """The image as an RGB ``PIL.Image``; Pillow's error if the bytes are no image it can read."""
    with pillow().open(io.BytesIO(data)) as image:
        image.load()  # decodes the pixels, so that a truncated file fails here and not in training
        return image.convert("RGB")


def row_images(cell: Any, messages: Sequence[dict], folder: Path, where: str, image_key: str) -> list[bytes]:
    """The checked, encoded images of one row (``cell``: its image column's value, None or a list)."""
    entries = [] if cell is None else cell
    if not isinstance(entries, (list, tuple)):
        raise RlcoreError(f"{where}: column {image_key!r} holds {type(cell).__name__}; expected a list of "
                          "{'bytes', 'path'} images")
    expected = placeholder_count(messages)
    if expected != len(entries):
        raise RlcoreError(f"{where}: the prompt has {expected} {PLACEHOLDER} placeholder(s) but column "
                          f"{image_key!r} holds {len(entries)} image(s); each {PLACEHOLDER} stands for the next "
                          "image of the row, so they must be as many")
    images = []
    for number, entry in enumerate(entries):
        what = f"{where}: image {number} of column {image_key!r}"
        data = entry_bytes(entry, folder, what)
        try:
            decode(data)
        except Exception as exc:  # noqa: BLE001 - Pillow raises several kinds for bytes it cannot decode
            from PIL import UnidentifiedImageError

            reason = ("no image format Pillow reads" if isinstance(exc, UnidentifiedImageError)
                      else f"{type(exc).__name__}: {exc}")
            raise RlcoreError(f"{what} cannot be decoded as an image ({len(data)} bytes): {reason}") from None
        images.append(data)
    return images


def encode_png(image) -> dict[str, Any]:
    """A ``PIL.Image`` as verl's image entry: PNG bytes and no path."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def processor_messages(messages: Sequence[dict], images: Sequence[bytes]) -> list[dict]:
    """The messages with each ``<image>`` replaced as verl's ``_build_messages`` does, for a processor's
    chat template: a message that holds a placeholder becomes a list of ``{"type": "image", "image":
    PIL.Image}`` and ``{"type": "text", "text": ...}`` parts; the others are left as they are."""
    pending = iter(images)
    out = []
    for message in messages:
        content = message.get("content")
        if not images or not isinstance(content, str):
            out.append(dict(message))
            continue
        parts = []
        for segment in filter(None, _SPLIT.split(content)):
            if segment == PLACEHOLDER:
                parts.append({"type": "image", "image": decode(next(pending))})
            else:
                parts.append({"type": "text", "text": segment})
        out.append({**message, "content": parts})
    return out


def image_column_type():
    """verl's (the ``datasets`` library's) type of an images column: a list of {bytes, path}."""
    import pyarrow as pa

    return pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
