"""Where the trainer's host waits for the GPU, and what its host work costs (the GPU machine; no vLLM needed).

``waits``: an fsdp actor's update of 8 rows on a tiny model, padded and packed, in 1 and in 8 micro-batches,
under CUDA's sync debug mode "warn": how often the host waited for the device, and where (the Python stack of
each wait). ``copies``: the host's time for a micro-batch's copy to the GPU through pinned memory
(``rlcore.runtime.transfer.to_device``) against a plain one from pageable memory, with the GPU idle and with
~50 ms of kernels queued ahead; and a gather of 40 of 512 rows (``Batch.select``) as ``v[idx]`` against
``index_select``, with 16 torch threads and with 1.

    python3 benchmarks/host_waits.py waits copies
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def waits() -> None:
    import attrs

    from rlcore.batch import Batch
    from rlcore.plugins.manager import get_manager
    from rlcore.runtime.platforms import current_platform
    from rlcore.testing import build_actor, build_reference, build_tiny_model
    from tests.fsdp.helpers import RESPONSE_LENGTH, job, make_batch

    platform = current_platform()
    backend = get_manager().get("training_backends", "fsdp")
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    batch = make_batch(8)
    where: collections.Counter = collections.Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            stack = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
            where[" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(stack[-6:]))] += 1

    for packed in (False, True):
        for micro in (8, 1):
            config = job(model, dtype="auto", actor={"ppo_mini_batch_size": 8, "use_kl_loss": True,
                                                     "ppo_micro_batch_size_per_gpu": micro})
            config = attrs.evolve(config, model=attrs.evolve(config.model, use_remove_padding=packed))
            actor, reference = build_actor(backend, config, platform), build_reference(backend, config, platform)
            step = batch.update(actor.compute_log_prob(batch)).update(reference.compute_ref_log_prob(batch)).update(
                Batch({"advantages": torch.linspace(-1.0, 1.0, 8).unsqueeze(-1).expand(8, RESPONSE_LENGTH)}))
            actor.update(step)  # the first update allocates the optimizer's state
            torch.cuda.synchronize()
            where.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = show
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    actor.update(step)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            print(f"{'packed' if packed else 'padded'} rows, {8 // micro} micro-batch(es): "
                  f"{sum(where.values())} waits")
            for stack, count in where.most_common():
                print(f"   {count} x {stack}")


def copies() -> None:
    from rlcore.runtime.transfer import to_device

    device = torch.device("cuda", 0)
    big = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def queue_work(ms: float = 50.0) -> None:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        big @ big
        end.record()
        torch.cuda.synchronize()
        for _ in range(max(1, int(ms / start.elapsed_time(end)))):
            big @ big

    for shape in ((16, 1024), (64, 1024), (512, 1024)):
        tensor = torch.randint(0, 1000, shape)
        for name, copy in (("pinned", lambda: to_device(tensor, device)), ("pageable", lambda: tensor.to(device))):
            for busy in (False, True):
                times = []
                for _ in range(20):
                    queue_work() if busy else torch.cuda.synchronize()
                    start = time.perf_counter()
                    copy()
                    times.append(time.perf_counter() - start)
                print(f"{shape} {name:8s} gpu {'busy' if busy else 'idle'}: host "
                      f"{statistics.median(times) * 1e3:.3f} ms (median of 20)")
    rows, index = torch.randint(0, 1000, (512, 1024)), torch.randperm(512)[:40]
    for threads in (16, 1):
        torch.set_num_threads(threads)
        for name, gather in (("v[idx]", lambda: rows[index]), ("index_select", lambda: rows.index_select(0, index))):
            gather()
            start = time.perf_counter()
            for _ in range(200):
                gather()
            print(f"threads {threads} {name}: {(time.perf_counter() - start) / 200 * 1e6:.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="+", choices=("waits", "copies"))
    for part in parser.parse_args().parts:
        {"waits": waits, "copies": copies}[part]()
