"""MkDocs hook: regenerate the configuration reference from the schema before every build, so the
site never shows keys that the code no longer has (the committed page is checked by a test too)."""

from pathlib import Path

from rlcore.config.reference import render


def on_pre_build(config, **kwargs):
    page = Path(config["docs_dir"]) / "config-reference.md"
    text = render()
    if not page.exists() or page.read_text(encoding="utf-8") != text:
        page.write_text(text, encoding="utf-8")
