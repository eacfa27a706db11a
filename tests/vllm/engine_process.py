"""Engine checks of ``tests/vllm/test_routed_experts.py`` that start vLLM engines in a process of their
own: vLLM 0.22.1 on a GPU refuses to start an engine in a process where an earlier one frees memory
while it profiles ("Error in memory profiling"), as the pytest process's earlier engines do.

    python -m tests.vllm.engine_process bf16-agreement MOE_MODEL_DIR
        prints {"agreement": ..., "near_ties": ...} as one JSON line
    python -m tests.vllm.engine_process moe-after-dense DENSE_MODEL_DIR MOE_MODEL_DIR
        exits 0 when a MoE engine started after a dense one generates transformers' greedy tokens
    python -m tests.vllm.engine_process family-refusal FAMILY MODEL_DIR
        exits 0 when vLLM refuses the family's model as tests/families.py's VLLM_REFUSED says (an engine
        that fails to start leaves vLLM's process-wide groups torn down: the engines of later tests in
        the same process could not start, "world group is not initialized")
"""

from __future__ import annotations

import json
import sys


def main(command: str, *models: str) -> None:
    from tests.vllm import test_routed_experts as checks

    if command == "bf16-agreement":
        agreement, near_ties = checks.bf16_agreement(*models)
        print(json.dumps({"agreement": agreement, "near_ties": near_ties}))
    elif command == "moe-after-dense":
        checks.moe_engine_after_a_dense_one(*models)
        print("a MoE engine after a dense one: greedy tokens equal transformers'")
    elif command == "family-refusal":
        from tests.vllm import test_families as families

        families.refused_as_expected(*models)
        print(f"{models[0]}: refused by vLLM as expected")
    else:
        raise SystemExit(f"unknown check {command!r}: bf16-agreement, moe-after-dense or family-refusal")


if __name__ == "__main__":
    main(*sys.argv[1:])
