"""A bf16 vllm engine's routed experts against transformers' bf16 routing, in a process of its own
(``tests/vllm/test_routed_experts.py``): prints {"agreement": ..., "near_ties": ...} as one JSON line.

    python -m tests.vllm.routed_experts_bf16 MODEL_DIR
"""

from __future__ import annotations

import json
import sys


def main(model: str) -> None:
    from tests.vllm.test_routed_experts import bf16_agreement

    agreement, near_ties = bf16_agreement(model)
    print(json.dumps({"agreement": agreement, "near_ties": near_ties}))


if __name__ == "__main__":
    main(sys.argv[1])
