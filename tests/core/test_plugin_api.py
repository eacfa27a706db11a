"""Plugins import the core only through ``rlcore.api``, and every name there is documented."""

import ast
import inspect
from pathlib import Path

import pytest

import rlcore.api

ROOT = Path(__file__).resolve().parents[2]


def plugin_packages() -> list[Path]:
    """The built-in plugin packages (``rlcore_*``) and the third-party-style ones under ``plugins/``."""
    built_in = sorted(p for p in ROOT.glob("rlcore_*") if (p / "__init__.py").is_file())
    third_party = sorted(p for p in ROOT.glob("plugins/*") if p.is_dir())
    return built_in + third_party


def core_imports_outside_api(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source`` that reaches the core other than through
    ``rlcore.api``: ``from rlcore.x import ...``, ``from rlcore import x``, ``import rlcore.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rlcore":
                found += [(node.lineno, f"rlcore.{alias.name}") for alias in node.names if alias.name != "api"]
            elif node.module.startswith("rlcore.") and node.module != "rlcore.api":
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names
                      if alias.name == "rlcore" or alias.name.startswith("rlcore.") and alias.name != "rlcore.api"]
    return found


def test_the_plugin_packages_are_found():
    names = {p.name for p in plugin_packages()}
    assert {"rlcore_fsdp", "rlcore_megatron", "rlcore_vllm", "rlcore_sglang", "rlcore_rocm", "rlcore_ascend",
            "rlcore-example"} <= names
    assert all(list(p.rglob("*.py")) for p in plugin_packages())


def test_plugins_import_only_rlcore_api():
    offences = []
    for package in plugin_packages():
        for path in sorted(package.rglob("*.py")):
            if "build" in path.relative_to(package).parts:  # a local `pip install` copy, not the source
                continue
            for line, module in core_imports_outside_api(path.read_text()):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offences, ("plugin packages may import from the core only through rlcore.api:\n"
                          + "\n".join(offences))


@pytest.mark.parametrize("source, expected", [
    ("from rlcore.batch import Batch", [(1, "rlcore.batch")]),
    ("from rlcore import hookimpl", [(1, "rlcore.hookimpl")]),
    ("import rlcore.models.loading as m", [(1, "rlcore.models.loading")]),
    ("import rlcore", [(1, "rlcore")]),
    ("def f():\n    from rlcore.plugins.manager import get_manager", [(2, "rlcore.plugins.manager")]),
    ("from rlcore.api import Batch\nimport rlcore.api\nfrom rlcore import api", []),
    ("from rlcore_fsdp.actor import FsdpActor\nfrom .options import X", []),
])
def test_the_check_catches_every_import_form(source, expected):
    assert core_imports_outside_api(source) == expected


def test_every_api_name_exists_and_is_documented():
    doc = inspect.getdoc(rlcore.api)
    listed = {line.split()[0] for line in doc.splitlines() if line.startswith("    ") and len(line.split()) > 1}
    exported = set(rlcore.api.__all__)
    assert len(rlcore.api.__all__) == len(exported), "a name is listed twice in rlcore.api.__all__"
    assert exported == listed, (f"undocumented: {sorted(exported - listed)}; "
                                f"documented but not exported: {sorted(listed - exported)}")
    for name in exported:
        assert getattr(rlcore.api, name) is not None


def test_the_api_module_has_no_public_name_beyond_all():
    public = {name for name, value in vars(rlcore.api).items()
              if not name.startswith("_") and not inspect.ismodule(value)}
    assert public == set(rlcore.api.__all__)


def test_a_roles_metric_goes_under_the_role_unless_it_names_its_own_group():
    assert rlcore.api.role_metric_name("actor", "pg_loss") == "actor/pg_loss"
    assert rlcore.api.role_metric_name("actor", "rollout_corr/kl") == "rollout_corr/kl"
