"""Sleep and wake one vllm engine in this process (``tests/vllm/test_on_gpu.py``): prints the device
memory in use awake, asleep and woken again, and whether greedy output survived, as one JSON line.

    python -m tests.vllm.sleep_and_wake MODEL_DIR UTILIZATION
"""

from __future__ import annotations

import json
import sys

import torch


def main(model: str, utilization: float) -> None:
    from rlcore.runtime.platforms import current_platform
    from tests.vllm.test_on_gpu import GREEDY, engine_for, prompts_for, smollm2_job

    platform = current_platform()
    engine = engine_for(smollm2_job(model, "bfloat16", free_cache_engine=True, gpu_memory_utilization=utilization),
                        platform)
    if not engine.sleeps:
        raise SystemExit("vLLM reports no sleep mode on this GPU")
    prompts = prompts_for(model)
    before = engine.generate(prompts, GREEDY)["responses"]

    def in_use() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    awake = in_use()
    engine.release_memory()
    asleep = in_use()
    engine.resume_memory()
    woken = in_use()
    same = torch.equal(engine.generate(prompts, GREEDY)["responses"], before)
    print(json.dumps({"total": torch.cuda.mem_get_info()[1], "awake": awake, "asleep": asleep, "woken": woken,
                      "same_greedy_output": same}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
