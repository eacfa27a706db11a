"""What the veomni tests share: the library they need."""

from __future__ import annotations

import pytest


def needs_veomni():
    """veomni, or skip: it is not in the [test] extra (docs/backend-veomni.md says why)."""
    return pytest.importorskip("veomni", reason="veomni is not installed: pip install 'rlcore[veomni]' (veomni 0.1.12 "
                                                "with transformers 5.9.0; docs/backend-veomni.md)")
