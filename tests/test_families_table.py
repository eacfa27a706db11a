"""docs/models.md's family table is what ``python -m tests.families_table`` writes from the family tests'
own lists."""

from __future__ import annotations

from pathlib import Path

from tests.families import FAMILIES, VLLM_REFUSED
from tests.families_table import BEGIN, END, render, rewrite

PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"


def test_the_page_holds_the_generated_table():
    page = PAGE.read_text()
    assert rewrite(page) == page, "docs/models.md's family table is out of date: python -m tests.families_table " \
                                  "docs/models.md"


def test_the_table_has_a_row_per_family_and_names_each_refusal():
    table = render()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line.split("|")[1]]
    assert len(rows) == len(FAMILIES)
    for why, errors in VLLM_REFUSED.values():
        assert why in table and all(says in table for _, says in errors)
    assert table.startswith(BEGIN) and table.endswith(END)
