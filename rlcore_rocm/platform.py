"""The ``rocm`` platform: AMD GPUs through a ROCm build of torch.

A ROCm build drives AMD GPUs through the ``torch.cuda`` API with device type "cuda", and its "nccl"
backend is RCCL, so the device calls are ``CudaPlatform``'s. What differs is detection
(``torch.version.hip`` instead of ``torch.version.cuda``), the three variables that pick devices, and
what vLLM needs.

Picking devices on ROCm (ROCm's "GPU isolation" page, torch's ``_parse_visible_devices``):
``ROCR_VISIBLE_DEVICES`` is applied first, by the ROCm runtime, to physical indices or UUIDs;
``HIP_VISIBLE_DEVICES`` then picks by index among what ROCR left; ``CUDA_VISIBLE_DEVICES`` means the
same as HIP's and is read only when HIP's is unset. vLLM on ROCm insists that HIP's and CUDA's agree
and numbers devices by CUDA's; Ray (2.60) sets HIP's for each actor and refuses ROCR's alone. So
rlcore writes one list to HIP and CUDA, and folds ROCR's into it where the result is the same.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import torch

from rlcore.api import CudaPlatform, Platform, RlcoreError

ROCR = "ROCR_VISIBLE_DEVICES"
HIP = "HIP_VISIBLE_DEVICES"
CUDA = "CUDA_VISIBLE_DEVICES"


class RocmPlatform(CudaPlatform):
    """AMD Instinct / Radeon GPUs: torch.cuda on a HIP build, RCCL behind "nccl", Ray resource "GPU"."""

    name = "rocm"
    visible_devices_env = HIP
    detect_order = 90
    concurrent_sharing_faster = False  # CUDA MPS is NVIDIA's; device_sharing = "auto" takes turns here
    # and none other is driven here: device_sharing = "concurrent" is refused before the job starts, by name
    start_device_sharing = Platform.start_device_sharing
    device_sharing_missing = Platform.device_sharing_missing

    @classmethod
    def is_available(cls) -> bool:
        return torch.version.hip is not None and torch.cuda.is_available() and torch.cuda.device_count() > 0

    def visible_devices_env_for(self, device_ids: list[int]) -> dict[str, str]:
        value = ",".join(str(i) for i in device_ids)
        return {HIP: value, CUDA: value}

    def reconcile_visible_devices(self, environ: MutableMapping[str, str]) -> None:
        for key, value in reconciled_visible_devices(environ).items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value

    def engine_env(self, engine: str) -> dict[str, str]:
        if engine == "vllm":
            # A HIP context does not survive fork; vLLM on ROCm overrides "fork" itself, with a warning.
            return {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        return {}


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")] if value.strip() else []


def reconciled_visible_devices(environ: Mapping[str, str]) -> dict[str, str | None]:
    """The changes (``None``: unset) that leave HIP == CUDA and ROCR only where it is needed.

    The devices the process sees stay the same. ROCR's list of indices is folded into HIP/CUDA
    (physical indices need no ROCR); a ROCR list of UUIDs stays, with HIP/CUDA indexing into it.
    """
    rocr, hip, cuda = environ.get(ROCR), environ.get(HIP), environ.get(CUDA)
    picked = hip if hip is not None else cuda  # HIP's wins: torch and the HIP runtime read it first
    if rocr is None:
        return {} if picked is None else {HIP: picked, CUDA: picked}

    exposed = _entries(rocr)
    if picked is None:
        indices = list(range(len(exposed)))
    else:
        source = HIP if hip is not None else CUDA
        indices = []
        for entry in _entries(picked):
            if not entry.isdigit():
                raise RlcoreError(
                    f"{source}={picked!r} must list device indices when {ROCR}={rocr!r} is set: it picks "
                    f"among the {len(exposed)} devices ROCR exposes; unset one of the two"
                )
            if int(entry) >= len(exposed):
                raise RlcoreError(
                    f"{source}={picked!r} picks device {entry}, but {ROCR}={rocr!r} exposes only "
                    f"{len(exposed)} device(s), numbered from 0"
                )
            indices.append(int(entry))

    if all(entry.isdigit() for entry in exposed):
        physical = ",".join(exposed[i] for i in indices)
        return {ROCR: None, HIP: physical, CUDA: physical}
    relative = ",".join(str(i) for i in indices)
    return {HIP: relative, CUDA: relative}
