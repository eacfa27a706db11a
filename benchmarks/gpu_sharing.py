"""Two processes on one GPU: do their kernels run at the same time, or by turns?

A colocated asynchronous job puts the rollout engine and the trainer in two processes on one device.
This probe stands in for them with two plain torch workloads and times each alone, then both at once:

- ``decode``: what a small model's engine does at each step: a few dozen small matrix products,
  a synchronize, and some host work (``--host-ms``), over and over (bound by the host and by latency);
- ``train``: what the trainer does: large bf16 matrix products back to back (bound by the GPU).

Both at once, under the driver's default time slicing, each process's kernels wait for the other's
slice; under CUDA MPS (``--mps``: this probe starts a private MPS control daemon, and stops it) kernels of
the two processes can run side by side. Prints one JSON line per arrangement::

    python benchmarks/gpu_sharing.py            # alone and together, time slicing
    python benchmarks/gpu_sharing.py --mps      # the same under an MPS daemon of its own
    python benchmarks/gpu_sharing.py --mps --train-below-normal   # and the train process at a lower priority

``--train-below-normal`` adds a row under MPS where the train process is a client of below-normal priority
(``CUDA_MPS_CLIENT_PRIORITY=1``; NVIDIA's MPS documentation, "Environment Variables": 0 is normal, 1 below
normal), with every SM open to it: the decoding kernels are to go first without the SM limit whose shares
computed wrong (``--check``). ``--check`` checks that arrangement's kernels too.

The ratio that matters: ``together`` wall time against ``decode`` alone plus ``train`` alone
(1.0: no overlap at all; max(alone)/sum: perfect overlap).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import tempfile
import time


def decode(steps: int, host_ms: float, start) -> float:
    import torch
    layers = [torch.randn(576, 576, device="cuda", dtype=torch.bfloat16) for _ in range(30)]
    hidden = torch.randn(512, 576, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start.wait()
    began = time.perf_counter()
    for _ in range(steps):
        x = hidden
        for weight in layers:
            x = torch.tanh(x @ weight)
        torch.cuda.synchronize()
        time.sleep(host_ms / 1000)
    return time.perf_counter() - began


def train(steps: int, start) -> float:
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start.wait()
    began = time.perf_counter()
    for i in range(steps):
        a = (a @ b) / 8192 ** 0.5
        if i % 10 == 9:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def kernel_checks() -> dict[str, str]:
    """Each kernel a trainer's forward uses, on random inputs, against a float32 reference: 'ok' or what failed."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    found = {}

    def compare(name, got, want, tolerance):
        bad = (~torch.isfinite(got)).sum().item()
        error = (got.float() - want.float()).abs().max().item() if bad == 0 else float("nan")
        found[name] = "ok" if bad == 0 and error < tolerance else f"{bad} non-finite, max error {error:.3g}"

    a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    compare("matmul bf16", a.bfloat16() @ b.bfloat16(), a @ b, 2.0)
    lengths = [300, 17, 512, 128, 333, 64, 1, 200]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(sum(lengths), 9, 64, device="cuda") for _ in range(3))
    reference = torch.cat([F.scaled_dot_product_attention(*(t[s:e].transpose(0, 1) for t in (q, k, v)), is_causal=True)
                           .transpose(0, 1) for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())])
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
        causal = ({"window_size": (-1, 0)} if "window_size" in inspect.signature(varlen_attn).parameters
                  else {"is_causal": True})
        got = varlen_attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, max(lengths), max(lengths), **causal)
        compare("varlen_attn bf16", got, reference, 0.05)
    except Exception as exc:  # noqa: BLE001 - a probe reports what failed
        found["varlen_attn bf16"] = f"raised {type(exc).__name__}: {exc}"[:200]
    x = q[:512].transpose(0, 1).unsqueeze(0)
    compare("sdpa causal bf16", F.scaled_dot_product_attention(x.bfloat16(), x.bfloat16(), x.bfloat16(), is_causal=True),
            F.scaled_dot_product_attention(x, x, x, is_causal=True), 0.05)
    logits = torch.randn(4096, 49152, device="cuda") * 5
    compare("log_softmax bf16", torch.log_softmax(logits.bfloat16().float(), -1), torch.log_softmax(logits, -1), 0.5)
    found["multi_processor_count"] = str(torch.cuda.get_device_properties(0).multi_processor_count)
    return found


BELOW_NORMAL = {"CUDA_MPS_CLIENT_PRIORITY": "1"}  # an MPS client's priority: 0 normal, 1 below normal


def _check_worker(percent, results, env=None):
    if percent:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    os.environ.update(env or {})
    results.put(kernel_checks())


def check(label: str, percent: int | None, env: dict | None = None) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    worker = context.Process(target=_check_worker, args=(percent, results, env))
    worker.start()
    print(json.dumps({"sharing": label, "checks": results.get(timeout=300)}), flush=True)
    worker.join(timeout=60)


def _worker(name, args, start, results):
    if name == "train" and args.train_sm_percent:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(args.train_sm_percent)
    if name == "train" and args.train_priority_env:
        os.environ.update(args.train_priority_env)
    results.put((name, decode(args.decode_steps, args.host_ms, start) if name == "decode"
                 else train(args.train_steps, start)))


def timed(names: list[str], args) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(len(names) + 1), context.Queue()
    workers = [context.Process(target=_worker, args=(name, args, start, results)) for name in names]
    for worker in workers:
        worker.start()
    start.wait(timeout=120)
    began = time.perf_counter()
    seconds = dict(results.get(timeout=600) for _ in names)
    wall = time.perf_counter() - began
    for worker in workers:
        worker.join(timeout=60)
    return seconds | {"wall": wall}


class MpsDaemon:
    """A private MPS control daemon (its pipe and log folders in a temporary folder) for this probe."""

    def __enter__(self):
        binary = shutil.which("nvidia-cuda-mps-control")
        if binary is None:
            raise RuntimeError("nvidia-cuda-mps-control is not on PATH")
        self.folder = tempfile.mkdtemp(prefix="mps-")
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": f"{self.folder}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{self.folder}/log"}
        for path in self.env.values():
            os.makedirs(path)
        subprocess.run([binary, "-d"], env=os.environ | self.env, check=True, timeout=30)
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc):
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=os.environ | self.env, timeout=30)
        for name in self.env:
            os.environ.pop(name, None)
        log = os.path.join(self.env["CUDA_MPS_LOG_DIRECTORY"], "control.log")
        if os.path.exists(log):
            print("mps control.log:", open(log).read()[-2000:])


def probe(args, label: str) -> None:
    alone_decode = timed(["decode"], args)["decode"]
    alone_train = timed(["train"], args)["train"]
    together = timed(["decode", "train"], args)
    print(json.dumps({"sharing": label, "decode_alone_s": round(alone_decode, 3), "train_alone_s": round(alone_train, 3),
                      "together": {k: round(v, 3) for k, v in together.items()},
                      "wall_over_sum": round(together["wall"] / (alone_decode + alone_train), 3),
                      "decode_slowdown": round(together["decode"] / alone_decode, 3),
                      "train_slowdown": round(together["train"] / alone_train, 3)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mps", action="store_true", help="also run under a private MPS daemon")
    parser.add_argument("--decode-steps", type=int, default=400)
    parser.add_argument("--host-ms", type=float, default=2.0)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--train-sm-percent", type=int, nargs="*", default=[],
                        help="under MPS, also with the train process limited to these shares of the SMs")
    parser.add_argument("--train-below-normal", action="store_true",
                        help="under MPS, also with the train process a client of below-normal priority")
    parser.add_argument("--check", action="store_true",
                        help="instead of timing, check the trainer's kernels' results alone and under MPS")
    args = parser.parse_args()
    percents, args.train_sm_percent, args.train_priority_env = args.train_sm_percent, None, None
    if args.check:
        check("no MPS", None)
        with MpsDaemon():
            for percent in [None, *percents]:
                check(f"mps, limited to {percent}% of the SMs" if percent else "mps", percent)
            if args.train_below_normal:
                check("mps, below-normal priority", None, BELOW_NORMAL)
        return
    probe(args, "time slicing")
    if args.mps:
        with MpsDaemon():
            probe(args, "mps")
            for percent in percents:
                args.train_sm_percent = percent
                probe(args, f"mps, train limited to {percent}% of the SMs")
            if args.train_below_normal:
                args.train_sm_percent, args.train_priority_env = None, BELOW_NORMAL
                probe(args, "mps, train at below-normal priority")


if __name__ == "__main__":
    main()
