"""Sleep and wake one vllm engine in this process (``tests/vllm/test_on_gpu.py``): prints the device
memory in use awake, asleep and woken again, and whether greedy output survived, as one JSON line.

    python -m tests.vllm.sleep_and_wake MODEL_DIR UTILIZATION [--trainer-cache]

``--trainer-cache``: while the engine sleeps, a trainer's pass fills torch's cache (a block allocated and
freed, held by the caching allocator) so that the device keeps less free memory than the engine needs to
wake; the engine then wakes the way the hybrid worker wakes it (``rlcore.workers.hybrid.wake_engine``).
"""

from __future__ import annotations

import json
import sys

import torch


def main(model: str, utilization: float, trainer_cache: bool = False) -> None:
    from rlcore.runtime.platforms import current_platform
    from rlcore.workers.hybrid import wake_engine
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
    cached = 0
    if trainer_cache:  # the trainer's activations, freed into torch's cache: half the engine's claim left free
        free, total = torch.cuda.mem_get_info()
        block = torch.empty(int(free - 0.5 * utilization * total), dtype=torch.uint8, device="cuda")
        del block
        cached = torch.cuda.memory_reserved()
    wake_engine(engine, platform, engine_sleeps=True)
    woken = in_use()
    same = torch.equal(engine.generate(prompts, GREEDY)["responses"], before)
    print(json.dumps({"total": torch.cuda.mem_get_info()[1], "awake": awake, "asleep": asleep, "woken": woken,
                      "cached_before_wake": cached, "same_greedy_output": same}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), "--trainer-cache" in sys.argv[3:])
