"""The core names no plugin: no file under rlcore/ spells a plugin package, a name a plugin registers
(backend, engine, platform) or a plugin's config section, in code, strings, docstrings or comments.

The vocabulary comes from the plugins themselves (every ``rlcore_*`` package beside the core and what
the installed ones register), so a new plugin is covered without editing this test. Each file that may
name a plugin must be listed in ``ALLOWED`` with the reason; an entry whose file no longer names one
fails, so the list only shrinks.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from rlcore.plugins.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "rlcore"

# What a plugin registers that names it to a user; CLI commands are verbs ("export"), not plugin names.
NAMING_KINDS = ("training_backends", "rollout_engines", "platforms", "config_sections", "verl_keys")

# file -> why it may name a plugin. Empty: verl's keys for a plugin's tables (fsdp_config, megatron)
# are the plugin's to map, ignore or refuse (rlcore_register_verl_keys).
ALLOWED: dict[str, str] = {}


def plugin_vocabulary() -> set[str]:
    """Lower-case words that name a plugin: its package, and what it registers (a section by its
    last part: ``actor.fsdp`` -> ``fsdp``)."""
    packages = {p.name for p in ROOT.glob("rlcore_*") if (p / "__init__.py").is_file()}
    words = packages | {name.removeprefix("rlcore_") for name in packages}
    manager = PluginManager()
    core = {"rlcore"}  # the core's own plugins are registered by the rlcore distribution
    for plugin in manager.loaded:
        if plugin.provider.distribution in core and plugin.entry_point is None:
            continue
        for kind in NAMING_KINDS:
            words |= {name.rsplit(".", 1)[-1] for name in plugin.registered.get(kind, ())}
    return {w.lower() for w in words}


def plugin_mentions(source: str, vocabulary: set[str]) -> list[tuple[int, str]]:
    """(line, word) of each plugin word in ``source``'s names, strings and comments; a word counts
    where no letter or digit touches it (``fsdp_config`` names fsdp, ``cudagraph`` names no cuda)."""
    pattern = re.compile(r"(?<![a-z0-9])(" + "|".join(sorted(map(re.escape, vocabulary))) + r")(?![a-z0-9])")
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) or token.type == getattr(
                tokenize, "FSTRING_MIDDLE", None):
            for match in pattern.finditer(token.string.lower()):
                found.append((token.start[0] + token.string[:match.start()].count("\n"), match.group(1)))
    return found


def test_the_vocabulary_holds_the_built_in_plugins():
    assert {"rlcore_fsdp", "fsdp", "megatron", "vllm", "sglang", "rocm", "ascend"} <= plugin_vocabulary()
    assert "hf" not in plugin_vocabulary() and "cuda" not in plugin_vocabulary()  # the core's own


@pytest.mark.parametrize("source, expected", [
    ('x = "actor.fsdp.param_offload"', [(1, "fsdp")]),
    ("# verl's fsdp_config\nimport rlcore_vllm", [(1, "fsdp"), (2, "rlcore_vllm")]),
    ('"""Engines such as\nSGLang"""', [(2, "sglang")]),
    ("cudagraph = vllmx = 1", []),
])
def test_the_scan_finds_words_in_names_strings_and_comments(source, expected):
    assert plugin_mentions(source, {"fsdp", "rlcore_vllm", "sglang", "vllm"}) == expected


def test_no_core_module_names_a_plugin():
    vocabulary = plugin_vocabulary()
    offences, allowed_hits = [], set()
    for path in sorted(CORE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        mentions = plugin_mentions(path.read_text(encoding="utf-8"), vocabulary)
        if relative in ALLOWED:
            allowed_hits |= {relative} if mentions else set()
            continue
        offences += [f"{relative}:{line} names {word!r}" for line, word in mentions]
    assert not offences, "core code names a plugin (ask the registries, or let the plugin declare it):\n" + \
        "\n".join(offences)
    stale = sorted(set(ALLOWED) - allowed_hits)
    assert not stale, f"allowed to name a plugin but no longer does: remove from ALLOWED: {stale}"
