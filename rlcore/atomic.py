"""Staging files and folders that appear under their final name only when complete.

``tempfile`` creates private (0600 / 0700) entries; what is published gets the permissions a plain
``open``/``mkdir`` would have given under the process's umask.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def staging_dir(final: Path) -> Path:
    """An empty hidden folder beside ``final`` to build it in; publish it with ``publish``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


def staging_file(final: Path) -> Path:
    """An empty hidden file beside ``final`` to write; publish it with ``publish``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(descriptor)
    return Path(name)


def publish(staged: Path, final: Path) -> None:
    """Give ``staged`` ordinary permissions and rename it to ``final`` (atomic on one filesystem)."""
    os.chmod(staged, (0o777 if staged.is_dir() else 0o666) & ~_umask())
    os.replace(staged, final)
