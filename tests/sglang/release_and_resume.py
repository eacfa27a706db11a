"""Release and resume one sglang engine's memory (``tests/sglang/test_on_gpu.py``), in this process:
prints the device memory in use while the engine holds it, after the release and after the resume,
and whether greedy output survived (the weights refilled from the actor), as one JSON line.

    python -m tests.sglang.release_and_resume MODEL_DIR UTILIZATION
"""

from __future__ import annotations

import json
import sys

import torch
from rlcore.testing import build_actor


def main(model: str, utilization: float) -> None:
    from rlcore.plugins.manager import get_manager
    from rlcore.runtime.platforms import current_platform
    from tests.sglang.test_on_gpu import GREEDY, engine_for, prompts_for, smollm2_job

    platform = current_platform()
    config = smollm2_job(model, "bfloat16", free_cache_engine=True, gpu_memory_utilization=utilization)
    actor = build_actor(get_manager().get("training_backends", "fsdp"), config, platform)
    engine = engine_for(config, platform, actor)
    prompts = prompts_for(model)

    def in_use() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    try:
        before = engine.generate(prompts, GREEDY)["responses"]
        held = in_use()
        engine.release_memory()
        released = in_use()
        engine.resume_memory()  # the weights come back from the actor
        resumed = in_use()
        same = torch.equal(engine.generate(prompts, GREEDY)["responses"], before)
    finally:
        engine.engine.shutdown()
    print(json.dumps({"total": torch.cuda.mem_get_info()[1], "held": held, "released": released, "resumed": resumed,
                      "same_greedy_output": same}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
