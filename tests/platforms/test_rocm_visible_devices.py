"""ROCm's three visible-devices variables: how they combine, and what rlcore leaves set.

ROCR_VISIBLE_DEVICES filters first (physical indices or UUIDs); HIP_VISIBLE_DEVICES picks by index
among what is left; CUDA_VISIBLE_DEVICES means what HIP's means and counts only when HIP's is unset.
Reconciling must keep the devices a process sees and leave HIP == CUDA, as vLLM on ROCm requires.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlcore.errors import RlcoreError
from rlcore_rocm.platform import CUDA, HIP, ROCR, RocmPlatform, reconciled_visible_devices


def reconcile(env: dict[str, str]) -> dict[str, str]:
    env = dict(env)
    RocmPlatform().reconcile_visible_devices(env)
    return env


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, {}),
        ({HIP: "0,1"}, {HIP: "0,1", CUDA: "0,1"}),
        ({CUDA: "2"}, {HIP: "2", CUDA: "2"}),
        # A Ray actor: Ray set HIP's; CUDA's was inherited from the driver. HIP's is what the process sees.
        ({HIP: "1", CUDA: "0,1,2,3"}, {HIP: "1", CUDA: "1"}),
        # Slurm or an older Ray set ROCR's alone: physical indices move to HIP/CUDA.
        ({ROCR: "3"}, {HIP: "3", CUDA: "3"}),
        ({ROCR: "4,5,6", HIP: "2,0"}, {HIP: "6,4", CUDA: "6,4"}),
        ({ROCR: "4,5", CUDA: "1"}, {HIP: "5", CUDA: "5"}),
        # UUIDs cannot move into HIP's numbering by index: ROCR's stays and HIP/CUDA count within it.
        ({ROCR: "GPU-aa,GPU-bb"}, {ROCR: "GPU-aa,GPU-bb", HIP: "0,1", CUDA: "0,1"}),
        ({ROCR: "GPU-aa,GPU-bb", HIP: "1"}, {ROCR: "GPU-aa,GPU-bb", HIP: "1", CUDA: "1"}),
        # Empty means no device at all, and stays so.
        ({ROCR: ""}, {HIP: "", CUDA: ""}),
        ({HIP: ""}, {HIP: "", CUDA: ""}),
    ],
)
def test_reconcile(before, after):
    assert reconcile(before) == after
    assert reconcile(after) == after  # a reconciled environment is left alone


def test_other_variables_are_untouched():
    assert reconcile({ROCR: "1", "PATH": "/bin"}) == {HIP: "1", CUDA: "1", "PATH": "/bin"}


def test_hip_picking_beyond_rocr_is_an_error_naming_both():
    with pytest.raises(RlcoreError, match=r"HIP_VISIBLE_DEVICES='2' picks device 2, but ROCR_VISIBLE_DEVICES='0,1' "
                                          r"exposes only 2 device"):
        reconcile({ROCR: "0,1", HIP: "2"})


def test_uuids_in_hip_under_rocr_are_an_error():
    with pytest.raises(RlcoreError, match="must list device indices when ROCR_VISIBLE_DEVICES"):
        reconcile({ROCR: "0,1", CUDA: "GPU-aa"})


def test_visible_devices_env_for_sets_hip_and_cuda_alike():
    assert RocmPlatform().visible_devices_env_for([0, 3]) == {HIP: "0,3", CUDA: "0,3"}
    assert reconciled_visible_devices(RocmPlatform().visible_devices_env_for([0, 3])) == {HIP: "0,3", CUDA: "0,3"}


# torch's own parser of these variables (ROCm builds) is the independent judge of what a process sees.
_parse_visible_devices = getattr(torch.cuda, "_parse_visible_devices", None)


@pytest.mark.skipif(_parse_visible_devices is None, reason="this torch has no torch.cuda._parse_visible_devices")
@pytest.mark.parametrize(
    "env",
    [{ROCR: "1,2,3", HIP: "0"}, {ROCR: "0"}, {CUDA: "0,1,2,3", HIP: "0"}, {HIP: "3,1"}, {ROCR: "4,5,6", HIP: "2,0"},
     {ROCR: "GPU-aa,GPU-bb"}],
)
def test_torch_on_rocm_sees_as_many_devices_after_reconciling(env, rocm_torch, monkeypatch):
    def seen(variables: dict[str, str]) -> int:
        for name in (ROCR, HIP, CUDA):
            monkeypatch.delenv(name, raising=False)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return len(_parse_visible_devices())

    assert seen(reconcile(env)) == seen(env)


PHYSICAL = 8


def physical_devices(env: dict[str, str]) -> list[int]:
    """The physical GPUs a HIP process sees under ``env`` on a machine of PHYSICAL GPUs."""
    exposed = [int(x) for x in env[ROCR].split(",") if x] if ROCR in env else list(range(PHYSICAL))
    picked = env.get(HIP, env.get(CUDA))
    return exposed if picked is None else [exposed[int(x)] for x in picked.split(",") if x]


@st.composite
def environments(draw) -> dict[str, str]:
    env: dict[str, str] = {}
    exposed = list(range(PHYSICAL))
    if draw(st.booleans()):
        exposed = draw(st.lists(st.sampled_from(range(PHYSICAL)), unique=True, max_size=PHYSICAL))
        env[ROCR] = ",".join(map(str, exposed))
    indices = st.lists(st.sampled_from(range(len(exposed))), unique=True) if exposed else st.just([])
    for name in (HIP, CUDA):
        if draw(st.booleans()):
            env[name] = ",".join(map(str, draw(indices)))
    return env


@given(environments())
def test_reconciling_keeps_the_devices_and_leaves_one_consistent_list(env):
    after = reconcile(env)
    assert physical_devices(after) == physical_devices(env)
    assert ROCR not in after  # integer ROCR lists always fold away
    assert after.get(HIP) == after.get(CUDA)
    assert reconcile(after) == after
