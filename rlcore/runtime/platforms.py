"""Hardware platforms: everything the core, backends and engines need to know about a device.

Code outside platform plugins never calls ``torch.cuda`` or checks a vendor: it asks
``current_platform()`` (``tests/platforms/test_no_vendor_checks.py`` enforces this). Platforms are
registered by plugins (``rlcore_register_platforms``); detection tries them in ``detect_order``
(lowest first: cuda 100, cpu 1000; a plugin's platform below 100 is tried before CUDA) and
``RLCORE_PLATFORM`` forces one.
"""

from __future__ import annotations

import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import torch

from rlcore.errors import RlcoreError, SharingUnavailable, did_you_mean
from rlcore.runtime.cuda_mps import mps_missing, start_mps
from rlcore.plugins.manager import get_manager


class Platform(ABC):
    """One kind of accelerator (or the CPU) and how to drive it."""

    name: str = ""  # the registered name, what RLCORE_PLATFORM takes
    device_type: str = ""  # torch device type: "cpu", "cuda" (also on AMD GPUs), "npu"
    dist_backend: str = ""  # torch.distributed backend for device tensors: "gloo", "nccl", "hccl"
    visible_devices_env: str | None = None  # the variable rlcore sets to pick devices; None: CPU
    ray_resource: str | None = None  # Ray resource of one device, e.g. "GPU"; None: CPU only
    detect_order: int = 50  # lower is tried first; the CPU is last
    lends_memory: bool = False  # share_with_processes / open_shared work: processes of one device share memory
    compiles_kernels: bool = False  # torch.compile's generated kernels (inductor, Triton) run on its devices
    # a colocated job's trainer and engine were measured faster with their kernels side by side
    # (start_device_sharing) than taking turns: async_training.device_sharing = "auto" starts it
    concurrent_sharing_faster: bool = False

    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this platform's devices can be used in this process."""

    @abstractmethod
    def device_count(self) -> int:
        """How many devices this process sees."""

    @abstractmethod
    def device_name(self, index: int = 0) -> str:
        """The product name of device ``index``, for logs."""

    @abstractmethod
    def memory_stats(self, index: int = 0) -> dict[str, int]:
        """Bytes: ``allocated``, ``reserved``, ``peak_allocated``, ``total``."""

    @abstractmethod
    def empty_cache(self) -> None:
        """Hand cached, unused device memory back to the driver."""

    def device(self, index: int = 0) -> torch.device:
        """The torch device ``index`` of this platform (the CPU has one)."""
        return torch.device(self.device_type, index)

    def set_device(self, index: int) -> None:
        """Make ``index`` the current device of this process (no-op where there is none)."""

    def manual_seed(self, seed: int) -> None:
        """Seed Python, numpy, torch and every device of this process."""
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    @property
    def default_dtype(self) -> torch.dtype:
        """The dtype models train in: bf16 on accelerators, fp32 on the CPU."""
        return torch.bfloat16

    @property
    def device_module(self) -> ModuleType:
        """torch's module for this device (``torch.cuda``, ``torch.npu``, ``torch.cpu``), for the calls
        spelled the same on every device: ``synchronize()``, ``get_rng_state()``, ``Event``, ..."""
        return getattr(torch, self.device_type)

    @property
    def dist_init_backend(self) -> str:
        """``backend=`` for ``torch.distributed.init_process_group``: the device's collectives for
        device tensors and gloo for CPU tensors (offloaded states, object collectives)."""
        return f"cpu:gloo,{self.device_type}:{self.dist_backend}"

    def side_process_group(self, store, rank: int, world_size: int, timeout):
        """A process group of this device's collectives beside the process's default one, over a
        ``torch.distributed`` store (the asynchronous mode's weight bridge). Gloo here; a platform
        whose device tensors need their own collectives overrides it."""
        import torch.distributed as dist

        return dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def ray_actor_options(self, devices: float) -> dict[str, Any]:
        """Ray ``.options(...)`` that reserve ``devices`` of this platform's devices for one actor."""
        if self.ray_resource is None or devices == 0:
            return {}
        if self.ray_resource == "GPU":  # Ray refuses "GPU" inside ``resources``
            return {"num_gpus": devices}
        return {"resources": {self.ray_resource: devices}}

    def visible_devices_env_for(self, device_ids: list[int]) -> dict[str, str]:
        """Environment variables that make a child process see exactly ``device_ids``, numbered as
        the machine numbers them (as Ray's accelerator ids are), not as a process whose own view is
        already narrowed numbers them."""
        if self.visible_devices_env is None:
            return {}
        return {self.visible_devices_env: ",".join(str(i) for i in device_ids)}

    def reconcile_visible_devices(self, environ: MutableMapping[str, str]) -> None:
        """Make the visible-devices variables in ``environ`` agree with each other, in place.

        Call it on ``os.environ`` before the process first touches a device: in the driver before
        ``ray.init``, in a Ray worker, before starting an engine. Raises ``RlcoreError`` when the
        variables contradict each other. Nothing to do where one variable is the only one.
        """

    def share_with_processes(self, flat: torch.Tensor) -> tuple[object, Callable[[], None]]:
        """Lend ``flat`` (a uint8 tensor on this process's device) to other processes of this node on
        the same device, without sending its bytes: (a picklable handle that ``open_shared`` maps in
        the other process, a function that ends the loan once they have copied it out). Only where
        ``lends_memory`` is true (elsewhere the weight bridge sends the bytes)."""
        raise RlcoreError(f"the {self.name} platform cannot lend memory to another process")

    @contextmanager
    def open_shared(self, handle: object) -> Iterator[torch.Tensor]:
        """The uint8 tensor another process lent with ``share_with_processes``, mapped into this one;
        valid inside the ``with`` block only (copy out what is kept). Every copy out has finished on
        the device when the block ends, so the lender may end the loan then."""
        raise RlcoreError(f"the {self.name} platform cannot map memory lent by another process")
        yield  # pragma: no cover - a generator, for contextmanager

    def start_device_sharing(self, compute_shares: tuple[float, ...] = (1.0,)):
        """Start what lets processes on one device run their kernels at the same moment (a colocated
        job's trainer and engine), until its ``stop()``; its ``env(compute_share, yields)`` gives the
        variables of a process that joins (``compute_share``: the part of the device its kernels may use, one
        of ``compute_shares``; ``yields``: the other processes' kernels go first when both wait, where the
        platform can order them) and its ``description`` names it. Raises ``SharingUnavailable`` saying why
        where the platform has none, or where a process limited to one of the shares would not compute
        right: the processes then take turns on the device."""
        raise SharingUnavailable(self._no_sharing())

    def device_sharing_missing(self) -> str | None:
        """Why ``start_device_sharing`` cannot succeed on this machine, where that shows without starting it
        (no sharing of the platform's own, a missing program); None where it may. A colocated job's
        arrangement and the checks before it starts read it."""
        return self._no_sharing() if type(self).start_device_sharing is Platform.start_device_sharing else None

    def _no_sharing(self) -> str:
        return f"the {self.name} platform has no way to run two processes' kernels side by side"

    def masked_attention_kernels(self) -> tuple | None:
        """The SDPA kernels (``torch.nn.attention.SDPBackend``) a trained model's attention with a mask
        may use on this platform; None: whichever torch picks."""
        return None

    def engine_env(self, engine: str) -> dict[str, str]:
        """Environment variables the rollout engine registered as ``engine`` needs on this platform, as
        a platform plugin knows them; the engine sets each one the user has not set before it starts.
        An engine's needs on every platform (the CPU's included) are the engine plugin's own."""
        return {}

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    visible_devices_env = None
    ray_resource = None
    detect_order = 1000
    lends_memory = True  # POSIX shared memory

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def device_name(self, index: int = 0) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        rss = _current_rss_bytes()
        return {"allocated": rss, "reserved": rss, "peak_allocated": peak, "total": total}

    def empty_cache(self) -> None:
        return None

    @property
    def default_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def dist_init_backend(self) -> str:
        return self.dist_backend

    def device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def share_with_processes(self, flat: torch.Tensor) -> tuple[object, Callable[[], None]]:
        """A POSIX shared-memory segment holding a copy of ``flat``; the handle is its name and size."""
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=max(flat.numel(), 1))
        view = torch.frombuffer(segment.buf, dtype=torch.uint8, count=flat.numel()) if flat.numel() else None
        if view is not None:
            view.copy_(flat)

        def end_loan() -> None:
            nonlocal view
            view = None  # the buffer's exports must be gone before it closes
            segment.close()
            segment.unlink()

        return (segment.name, flat.numel()), end_loan

    @contextmanager
    def open_shared(self, handle: object) -> Iterator[torch.Tensor]:
        name, size = handle
        segment = _attach_shared_memory(name)
        try:
            view = torch.frombuffer(segment.buf, dtype=torch.uint8, count=size) if size else torch.empty(0, dtype=torch.uint8)
            yield view
        finally:
            view = None
            segment.close()


def _attach_shared_memory(name: str):
    """Attach to another process's segment without adopting it: before Python 3.13 attaching also
    registers the segment with this process's resource tracker, which would unlink it (and warn of a
    leak) when this process ends; the lender unlinks it."""
    import sys
    from multiprocessing import resource_tracker, shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    segment = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(segment._name, "shared_memory")  # noqa: SLF001 - the tracker's own key
    return segment


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class CudaPlatform(Platform):
    """NVIDIA GPUs through torch.cuda. A torch built for AMD GPUs (HIP) also answers ``torch.cuda`` but
    reports ``torch.version.cuda = None``: it belongs to a platform plugin of its own."""

    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    detect_order = 100
    lends_memory = True  # CUDA IPC
    compiles_kernels = True  # inductor's Triton kernels
    # CUDA MPS, the trainer at half the SMs: the GSM8K job's colocated step 3.84 s against 4.40 by time
    # slices, 1 x H100, 2026-12-06 (docs/async.md)
    concurrent_sharing_faster = True

    def side_process_group(self, store, rank: int, world_size: int, timeout):
        import torch.distributed as dist

        return dist.ProcessGroupNCCL(store, rank, world_size)

    @classmethod
    def is_available(cls) -> bool:
        return torch.version.cuda is not None and torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def device_name(self, index: int = 0) -> str:
        return torch.cuda.get_device_name(index)

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        return {
            "allocated": torch.cuda.memory_allocated(index),
            "reserved": torch.cuda.memory_reserved(index),
            "peak_allocated": torch.cuda.max_memory_allocated(index),
            "peak_reserved": torch.cuda.max_memory_reserved(index),
            "total": torch.cuda.get_device_properties(index).total_memory,
        }

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def start_device_sharing(self, compute_shares: tuple[float, ...] = (1.0,)):
        return start_mps(compute_shares)

    def device_sharing_missing(self) -> str | None:
        return mps_missing()

    def masked_attention_kernels(self) -> tuple | None:
        """All but cuDNN's: with a mask its backward gave NaN query gradients on the H200 whenever a
        sequence's length was 64 past a multiple of 128 (pytorch/pytorch#196678, torch 2.11-2.13;
        benchmarks/attention_probe.py, docs/benchmarks.md 2026-12-03)."""
        from torch.nn.attention import SDPBackend

        return SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH

    def manual_seed(self, seed: int) -> None:
        super().manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def share_with_processes(self, flat: torch.Tensor) -> tuple[object, Callable[[], None]]:
        """CUDA IPC: torch's own handle of ``flat``'s device memory (what ``torch.multiprocessing``
        sends for a CUDA tensor: the allocation's IPC handle, the offset, a reference count shared with
        the receivers and an event the receiver waits on). The lender keeps ``flat`` until the loan
        ends; torch keeps the memory beyond that while a receiver still maps it."""
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, arguments = reduce_tensor(flat)
        kept = [flat]

        def end_loan() -> None:
            kept.clear()
            torch.cuda.ipc_collect()  # free what the receivers have let go of

        return (rebuild, arguments), end_loan

    @contextmanager
    def open_shared(self, handle: object) -> Iterator[torch.Tensor]:
        rebuild, arguments = handle
        mapped = rebuild(*arguments)  # waits for the lender's event: its writes are visible
        try:
            yield mapped
            torch.cuda.current_stream(mapped.device).synchronize()  # the copies out are done
        finally:
            del mapped


def detect_platform(platforms: dict[str, type[Platform]], forced: str | None = None) -> Platform:
    """The platform to use: ``forced`` (or ``RLCORE_PLATFORM``) if given, else the first available."""
    forced = forced if forced is not None else (os.environ.get("RLCORE_PLATFORM") or None)
    registered = ", ".join(sorted(platforms)) or "(none)"
    if forced is not None:
        if forced not in platforms:
            raise RlcoreError(
                f"RLCORE_PLATFORM={forced!r} is not a registered platform{did_you_mean(forced, platforms)}; "
                f"registered platforms: {registered}"
            )
        cls = platforms[forced]
        if not cls.is_available():
            raise RlcoreError(
                f"RLCORE_PLATFORM={forced!r} was forced but that platform is not available on this machine; "
                f"registered platforms: {registered}"
            )
        return cls()
    for cls in sorted(platforms.values(), key=lambda c: (c.detect_order, c.name)):
        if cls.is_available():
            return cls()
    raise RlcoreError(f"no registered platform is available here; registered platforms: {registered}")


_current: Platform | None = None


def current_platform() -> Platform:
    """The platform of this process, detected once among the registered platforms."""
    global _current
    if _current is None:
        registry = get_manager().registry("platforms")
        _current = detect_platform({name: registry.get(name) for name in registry})
    return _current


def reset_platform() -> None:
    global _current
    _current = None
