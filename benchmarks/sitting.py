"""What the benchmarks of a GPU sitting share: the GSM8K job they time (the example's sizes), GSM8K
written in rlcore's (verl's) parquet schema, peak GPU memory read from ``nvidia-smi``, and a command run
in a session of its own under a deadline that kills everything it started."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gsm8k_grpo_smollm2.toml"
PROMPTS, SAMPLES, MAX_NEW = 64, 8, 512
# how an asynchronous run corrects its stale samples: rollout importance sampling (threshold 2, what "auto"
# turns on), the engine's log-probs as the old policy's (no old log-prob pass), or nothing (no rollout
# log-probs either: the engine spares a third of its generation time with vLLM)
CORRECTIONS = {"is": ["algorithm.rollout_is_threshold=2.0", "algorithm.rollout_is=true"],
               "bypass": ["algorithm.rollout_bypass=true", "rollout.calculate_log_probs=true"],
               "none": ["rollout.calculate_log_probs=false"]}


# -- peak GPU memory -------------------------------------------------------------------------------
class GpuMemoryPeak:
    """Polls ``nvidia-smi`` for the memory in use on the first visible GPU; ``peak_gb`` is None
    where there is no nvidia-smi."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak_mib, self._stop = every_s, None, threading.Event()
        index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.command = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", index]
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                used = int(subprocess.run(self.command, capture_output=True, text=True, timeout=10).stdout.split()[0])
                self.peak_mib = max(self.peak_mib or 0, used)
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                return
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)

    @property
    def peak_gb(self) -> float | None:
        return None if self.peak_mib is None else round(self.peak_mib / 1024, 1)


class RanPastDeadline(SystemExit):
    """A job killed at its deadline; the steps it finished before may still be read back."""


def run_bounded(command: list[str], timeout_s: int, **kwargs) -> None:
    """``command`` in a session of its own; past ``timeout_s`` the whole session (Ray's processes too)
    is killed, so that a hung job leaves no process holding the GPU for the next one."""
    import signal

    process = subprocess.Popen(command, start_new_session=True, **kwargs)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise RanPastDeadline(f"{command[2]} ran past {timeout_s} s and was killed") from None
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what the job left behind in its session
        except ProcessLookupError:
            pass
    if code != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed with exit status {code}")


def gsm8k_parquet(gsm8k: Path, where: Path, split: str = "train") -> Path:
    """``split.parquet`` in rlcore's (verl's) schema, written by ``rlcore data gsm8k``."""
    from rlcore.data.gsm8k import preprocess

    return preprocess(where, gsm8k / f"{split}.jsonl", split)[split]
