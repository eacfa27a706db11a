"""Staging files and folders that appear under their final name only when complete.

``tempfile`` creates private (0600 / 0700) entries; what is published gets the permissions a plain
``open``/``mkdir`` would have given under the process's umask.
"""

from __future__ import annotations

import os
import shutil
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


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _set_aside(target: Path) -> Path:
    return target.parent / f".{target.name}.old"


def replace_directory(staged: Path, target: Path) -> None:
    """Make the complete folder ``staged`` the folder ``target`` durably (its files synced first),
    replacing any previous one: the old folder is set aside, the new one renamed in, then the old
    one removed. A crash between the two renames leaves the old folder aside, where
    ``recover_directory`` finds it."""
    for file in staged.rglob("*"):
        if file.is_file():
            _fsync(file)
    old = _set_aside(target)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    publish(staged, target)
    _fsync(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_directory(target: Path, marker: str) -> None:
    """Put back a folder that a crash inside ``replace_directory`` left aside (``marker``: a file
    that only a complete folder holds)."""
    old = _set_aside(target)
    if not target.exists() and (old / marker).is_file():
        os.replace(old, target)
