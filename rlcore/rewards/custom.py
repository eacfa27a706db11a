"""A user's reward function, loaded from a Python file by path and name (``reward.custom_reward_function``)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from rlcore.errors import RlcoreError


def load_reward_function(path: str, name: str = "compute_score") -> Callable:
    """Import ``path`` as a module and return its function ``name``; RlcoreError naming both if either is missing."""
    file = Path(path).expanduser().resolve()
    where = f"reward.custom_reward_function: path = {path!r}, name = {name!r}"
    if not file.is_file():
        raise RlcoreError(f"{where}: the file {file} does not exist")
    # A name unique to the file, so two reward files of the same name do not replace each other.
    module_name = f"rlcore_custom_reward_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RlcoreError(f"{where}: {file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure in the user's file, sys.exit included
        del sys.modules[module_name]
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if f.filename != __file__ and not f.filename.startswith("<frozen")]  # the user's lines only
        detail = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)).rstrip()
        raise RlcoreError(f"{where}: importing {file} failed:\n{detail}") from exc
    function = getattr(module, name, None)
    if function is None:
        defined = sorted(k for k, v in vars(module).items()
                         if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module_name)
        raise RlcoreError(f"{where}: {file} has no function {name!r}; "
                          f"functions it defines: {', '.join(defined) or '(none)'}")
    if not callable(function):
        raise RlcoreError(f"{where}: {name!r} in {file} is a {type(function).__name__}, not a function")
    return function
