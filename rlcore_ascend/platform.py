"""The ``ascend`` platform: Huawei Ascend NPUs through ``torch_npu``.

Importing ``torch_npu`` registers the ``torch.npu`` module and the "npu" device type. It is imported
only when the platform is asked something, never when this module or the plugin loads, so rlcore
starts without it and detection costs nothing where it is not installed.

What differs from a GPU, and who asks: the fsdp backend builds its device mesh on ``device_type``
("npu") and its process group on ``dist_init_backend`` ("cpu:gloo,npu:hccl"); Ray workers reserve
``ray_actor_options`` (resource "NPU", which Ray pins through ``ASCEND_RT_VISIBLE_DEVICES``); the
vllm engine (vLLM with the vllm-ascend plugin, which vLLM finds by itself) gets ``engine_env``.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

from rlcore.api import Platform, RlcoreError


def _npu() -> ModuleType:
    """``torch.npu``, importing ``torch_npu`` first; a broken install is an error, not "no NPU"."""
    try:
        import torch_npu  # noqa: F401 - registers torch.npu and the "npu" device type
    except Exception as exc:  # noqa: BLE001 - a missing CANN library raises OSError, not ImportError
        raise RlcoreError(
            f"torch_npu is installed but failed to import: {exc!r}. Source the CANN environment "
            "(set_env.sh) or set RLCORE_PLATFORM to another platform."
        ) from exc
    return torch.npu


class AscendPlatform(Platform):
    """Ascend NPUs: device type "npu", HCCL collectives, Ray resource "NPU"."""

    name = "ascend"
    device_type = "npu"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource = "NPU"
    detect_order = 80

    @classmethod
    def is_available(cls) -> bool:
        if importlib.util.find_spec("torch_npu") is None:
            return False
        npu = _npu()
        return bool(npu.is_available()) and npu.device_count() > 0

    @property
    def device_module(self) -> ModuleType:
        return _npu()

    def device_count(self) -> int:
        return _npu().device_count()

    def device_name(self, index: int = 0) -> str:
        return _npu().get_device_name(index)

    def set_device(self, index: int) -> None:
        _npu().set_device(index)

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        npu = _npu()
        return {
            "allocated": npu.memory_allocated(index),
            "reserved": npu.memory_reserved(index),
            "peak_allocated": npu.max_memory_allocated(index),
            "total": npu.get_device_properties(index).total_memory,
        }

    def empty_cache(self) -> None:
        _npu().empty_cache()

    def manual_seed(self, seed: int) -> None:
        super().manual_seed(seed)
        _npu().manual_seed_all(seed)

    def engine_env(self, engine: str) -> dict[str, str]:
        if engine == "vllm":
            return {
                # An NPU context does not survive fork (vllm-ascend's examples all use spawn).
                "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
                # Keep weights in ND layout: vllm-ascend's FRACTAL_NZ layout breaks loading new
                # weights into a running engine; its RL mode (rl_config) turns NZ off the same way.
                "VLLM_ASCEND_ENABLE_NZ": "0",
            }
        return {}
