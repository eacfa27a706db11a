"""What the torchtitan tests share: the library they need, the tiny Llama, a batch of padded rows."""

from __future__ import annotations

from pathlib import Path

import pytest


def needs_torchtitan():
    """torchtitan, or skip: it is not in the [test] extra (docs/backend-torchtitan.md says why)."""
    return pytest.importorskip("torchtitan", reason="torchtitan is not installed: pip install 'rlcore[torchtitan]' "
                                                    "(torchtitan 0.3.0 and triton; docs/backend-torchtitan.md)")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny Llama 3.1 (its rope scaling made to matter at a dozen tokens, untied output layer),
    the family matrix's (tests/families.py)."""
    from tests.families import build_family_model

    return build_family_model("llama", tmp_path_factory.mktemp("torchtitan-models") / "tiny-llama")


def padded_rows(rows: int = 4, prompt: int = 6, response: int = 5, seed: int = 0):
    """Rows as the rollout hands them over: prompts left-padded (rows 0 and 2 by 2 and 4), responses
    right-padded (row 1 ends after 3 tokens, row 2 after 1), random token ids of the tiny vocabulary."""
    import torch

    from rlcore.api import Batch

    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 500, (rows, prompt), generator=generator)
    response_ids = torch.randint(3, 500, (rows, response), generator=generator)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_mask[2, :4] = 0
    response_mask = torch.ones(rows, response, dtype=torch.long)
    response_mask[1, 3:] = 0
    response_mask[2, 1:] = 0
    mask = torch.cat([prompt_mask, response_mask], 1)
    input_ids = torch.cat([prompt_ids, response_ids], 1) * mask
    return Batch({"input_ids": input_ids, "attention_mask": mask,
                  "position_ids": (mask.cumsum(-1) - 1).clamp(min=0), "responses": response_ids * response_mask,
                  "response_mask": response_mask})


def transformers_log_probs(model_path, batch):
    """(B, R) log-probs of the batch's responses by a plain transformers forward (fp32), 0 past a response."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.api import load_causal_lm

    model = load_causal_lm(str(model_path), torch.float32) if str(model_path).startswith("embedded:") \
        else AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    response_length = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -response_length - 1:-1]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return log_probs * batch["response_mask"]
