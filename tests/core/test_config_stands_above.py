"""The configuration stands above the components whose tables it assembles: no module of
``rlcore/algorithms``, ``rlcore/rewards``, ``rlcore/data`` or ``rlcore/rollout``, nor any core module
they import, imports ``rlcore.config`` (not even under ``TYPE_CHECKING``). A component names
``JobConfig`` in a hint without importing it, or takes the few settings it reads."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("rlcore.algorithms", "rlcore.rewards", "rlcore.data", "rlcore.rollout")
CONFIG = "rlcore.config"


def core_modules() -> dict[str, Path]:
    """Dotted name -> file of every module under rlcore/."""
    modules = {}
    for path in (ROOT / "rlcore").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The core modules ``path`` imports, anywhere in it (a function's body, a TYPE_CHECKING block)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    found = set()
    for name in names:  # "rlcore.config.schema.JobConfig" -> the module rlcore.config.schema
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("rlcore"):
            found.add(name)
    return found


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_component_reaches_the_configuration():
    modules = core_modules()
    start = [m for m in modules if any(in_package(m, c) for c in COMPONENTS)]
    assert len(start) > 20, start  # the walk found the components' modules
    came_from: dict[str, str | None] = dict.fromkeys(start)
    queue = list(start)
    offences = []
    while queue:
        module = queue.pop()
        for target in sorted(imported(modules[module], modules)):
            if in_package(target, CONFIG):
                chain, step = [target], module
                while step is not None:
                    chain.append(step)
                    step = came_from[step]
                offences.append(" <- ".join(chain))
            elif target not in came_from:
                came_from[target] = module
                queue.append(target)
    assert not offences, "imports of rlcore.config below it:\n" + "\n".join(sorted(offences))
