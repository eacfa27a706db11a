"""Token lists from an engine become the same padded rows the hf engine returns."""

from __future__ import annotations

import json

import pytest
import torch

from rlcore.batch import Batch
from rlcore.errors import RlcoreError
from rlcore.rollout.outputs import eos_token_ids, prompt_tensors, response_rows, unpadded

PAD = 0


def test_prompt_tensors_take_the_mask_or_read_leading_pads():
    ids = torch.tensor([[PAD, 5, 6], [7, PAD, 9]])  # a pad mid-prompt (pad == eos) stays a token
    assert prompt_tensors(Batch({"prompts": ids}), PAD, "x")[1].tolist() == [[0, 1, 1], [1, 1, 1]]
    mask = torch.tensor([[0, 1, 1], [0, 0, 1]])
    given = prompt_tensors(Batch({"input_ids": ids, "attention_mask": mask}), PAD, "x")
    assert given[1].tolist() == mask.tolist()
    assert unpadded(*given) == [[5, 6], [9]]
    with pytest.raises(RlcoreError, match="the x engine needs prompt rows"):
        prompt_tensors(Batch({"responses": ids}), PAD, "x")


def test_response_rows_pad_mask_and_place_log_probs():
    prompts = torch.tensor([[PAD, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out = response_rows(prompts, mask, [[11, 12, 2], [21, 22, 23, 24, 25]], [[-0.5, -1.0, -0.25], [-1.0] * 5],
                        length=4, pad_id=PAD)
    assert out["responses"].tolist() == [[11, 12, 2, PAD], [21, 22, 23, 24]]  # cut to the length
    assert out["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert out["rollout_log_probs"].tolist() == [[-0.5, -1.0, -0.25, 0.0], [-1.0] * 4]
    assert out["input_ids"].tolist()[0] == [PAD, 5, 6, 11, 12, 2, PAD]
    assert out["attention_mask"].tolist()[0] == [0, 1, 1, 1, 1, 1, 0]
    assert out["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]
    short = response_rows(prompts, mask, [[1], []], None, 2, PAD)  # an empty response; no log-probs
    assert short["response_mask"].tolist() == [[1, 0], [0, 0]] and "rollout_log_probs" not in short


def test_eos_ids_join_generation_config_and_tokenizer(tmp_path):
    class Tokenizer:
        eos_token_id = 2

    assert eos_token_ids(str(tmp_path), Tokenizer()) == [2]  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert eos_token_ids(str(tmp_path), Tokenizer()) == [2, 7]
