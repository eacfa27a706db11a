"""Each family the megatron backend maps, built and run by megatron-core itself on the CPU: its logits
equal transformers' in fp32, and a Mistral's or Phi-3's sliding window matters (the same forward without it is far
off). One process for all families (tests/megatron/cpu_forward.py says what it points at the CPU)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import REPO
from tests.families import MEGATRON_MAPPED
from tests.megatron.conftest import needs_megatron
from tests.processes import run_process


@pytest.fixture(scope="module")
def forwards(tmp_path_factory) -> dict[str, dict]:
    needs_megatron()
    result = run_process([sys.executable, "-m", "tests.megatron.cpu_forward", str(tmp_path_factory.mktemp("families")),
                          *MEGATRON_MAPPED], name="megatron-core's forward of each family", timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {line["family"]: line for line in lines}


@pytest.mark.parametrize("family", MEGATRON_MAPPED)
def test_megatron_cores_logits_equal_transformers(forwards, family):
    found = forwards[family]
    assert found["logit_std"] > 0.5  # logits far from flat: a wrong rope, norm or mask shows
    assert found["max_abs_diff"] < 1e-4, found


@pytest.mark.parametrize("family", ["mistral", "phi3"])
def test_the_sliding_window_is_what_makes_megatron_agree_with_transformers(forwards, family):
    found = forwards[family]
    assert found["sliding_window"] == 4
    assert found["max_abs_diff"] < 1e-4 and found["max_abs_diff_without_the_window"] > 0.5, found
