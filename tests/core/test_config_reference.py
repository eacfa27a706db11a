"""docs/config-reference.md is generated from the schema: it is current, it holds every key with its
default, and plugin sections come from the plugins' own registrations."""

from __future__ import annotations

import re
import sys

import attrs

from rlcore import hookimpl
from rlcore.config.reference import render
from rlcore.config.schema import JobConfig
from rlcore.plugins.manager import PluginManager
from tests.conftest import REPO
from tests.processes import run_process

PAGE = REPO / "docs" / "config-reference.md"


def _sections(text: str) -> dict[str, dict[str, list[str]]]:
    """``[table]`` heading -> key -> the row's cells (type, default, checked, meaning)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        heading = re.match(r"^## `\[([\w.]+)\]`", line)
        if heading:
            current = sections.setdefault(heading.group(1), {})
        row = re.match(r"^\| `(\w+)` \| (.*) \|$", line)
        if row and current is not None:
            current[row.group(1)] = [cell.strip() for cell in re.split(r"(?<!\\)\|", row.group(2))]
    return sections


def _leaves(instance, path: str):
    """(table path, key, default value) of every key below ``instance``."""
    for field in attrs.fields(type(instance)):
        if field.metadata.get("internal"):
            continue
        value = getattr(instance, field.name)
        if attrs.has(type(value)):
            yield from _leaves(value, f"{path}.{field.name}")
        else:
            yield path, field.name, value


def test_the_committed_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/config-reference.md is out of date with the schema: python -m rlcore.config.reference "
        "docs/config-reference.md")


def test_every_schema_key_is_a_row_of_its_table_with_its_default():
    sections = _sections(render())
    leaves = [leaf for field in attrs.fields(JobConfig) if not field.metadata.get("internal")
              for leaf in _leaves(getattr(JobConfig(), field.name), field.name)]
    assert len(leaves) > 150
    for table, key, default in leaves:
        assert key in sections[table], f"[{table}] {key} is missing from the reference"
        cell = sections[table][key][1]
        if isinstance(default, bool):
            assert cell == f"`{str(default).lower()}`", (table, key, cell)
        elif isinstance(default, (int, float)):
            assert cell == f"`{default!r}`", (table, key, cell)
        elif default is None:
            assert cell == "unset", (table, key, cell)
    # the critic's optimizer has its own default learning rate, not the class's
    assert sections["critic.optim"]["lr"][1] == "`1e-05`" and sections["actor.optim"]["lr"][1] == "`1e-06`"
    assert "one of `\"raise\"`, `\"zero\"`" in sections["reward"]["on_error"][2]
    assert sections["actor"]["clip_ratio_c"][2] == "> 1"


def test_plugin_sections_come_from_registrations_of_rlcore_plugins_only():
    @attrs.frozen
    class ThirdPartyOptions:
        depth: int = 3

    class ThirdParty:
        @hookimpl
        def rlcore_register_config_sections(self, register):
            register("rollout.third_party", ThirdPartyOptions)

    manager = PluginManager(autoload=True, plugins={"third_party": ThirdParty()})
    sections = _sections(render(manager))
    assert "rollout.third_party" not in sections
    built_in = {entry.name for entry in manager.registry("config_sections").entries()
                if entry.provider.distribution == "rlcore"}
    assert {"rollout.vllm", "rollout.sglang"} <= built_in <= set(sections)
    assert sections["rollout.vllm"]["enable_prefix_caching"][1] == "`true`"


def test_check_mode_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "config-reference.md"
    stale.write_text(render().replace("AdamW learning rate", "learning rate"), encoding="utf-8")
    command = [sys.executable, "-m", "rlcore.config.reference", "--check", str(stale)]
    result = run_process(command, name="config reference --check", timeout=120)
    assert result.returncode == 1 and "out of date" in result.stderr
    written = run_process(command[:3] + [str(stale)], name="config reference", timeout=120)
    assert written.returncode == 0, written.stderr
    assert run_process(command, name="config reference --check", timeout=120).returncode == 0
    assert stale.read_text(encoding="utf-8") == render()
