"""Step times of the same tiny GRPO job on two training backends, alternating, on the CPU
(docs/benchmarks.md, "The torchtitan backend beside fsdp"): the tiny Llama of the e2e tests, 16 GSM8K
problems from ../shared, the hf engine, KL loss, in the job's own process.

    python benchmarks/backend_steps_cpu.py [FOLDER] [BACKEND ...]   # default: /tmp/backend-steps fsdp torchtitan
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlcore.testing import build_tiny_model  # noqa: E402
from tests.conftest import SHARED  # noqa: E402
from tests.e2e.conftest import job_overrides  # noqa: E402

PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor")


def prepared(root: Path) -> tuple[Path, Path]:
    model, data = root / "tiny-llama", root / "parquet"
    if not model.exists():
        build_tiny_model(model, family="llama")
    for split, count in (("train", 16), ("test", 4)):
        if (data / f"{split}.parquet").exists():
            continue
        with open(SHARED / "data" / "gsm8k" / f"{split}.jsonl") as src, open(root / f"{split}.jsonl", "w") as dst:
            dst.writelines(itertools.islice(src, count))
        subprocess.run([sys.executable, "-m", "rlcore", "data", "gsm8k", "--local-save-dir", str(data), "--input",
                        str(root / f"{split}.jsonl")], check=True, timeout=120)
    return model, data


def main(root: Path, backends: list[str], rounds: int = 2) -> None:
    root.mkdir(parents=True, exist_ok=True)
    model, data = prepared(root)
    for backend in backends * rounds:
        run = root / f"run-{backend}-{time.time():.0f}"
        overrides = job_overrides(model, data, run, **{"trainer.total_training_steps": 4, "trainer.save_freq": -1,
                                                      "trainer.test_freq": -1})
        result = subprocess.run([sys.executable, "-m", "rlcore", "train", *overrides, f"trainer.backend={backend}",
                                 "rollout.name=hf", "algorithm.adv_estimator=grpo", "rollout.n=2",
                                 "actor.use_kl_loss=true", "trainer.ray=false"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode:
            sys.exit(f"{backend}: the job failed\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        steps = [m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "timing_s/step" in m]
        later = steps[1:]  # the first step also builds the hf engine's module
        print(backend, {phase: round(sum(m[phase] for m in later) / len(later), 3) for phase in PHASES}, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/backend-steps"), sys.argv[2:] or ["fsdp", "torchtitan"])
