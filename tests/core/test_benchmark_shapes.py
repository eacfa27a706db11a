"""``benchmarks/shapes.py``: the shaped models' parameter counts (built on the meta device, so no memory),
checked against Qwen2.5's published counts, and a tiny shape written to a folder that loads back."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import shapes  # noqa: E402

# Qwen2.5's own vocabularies (its configs' vocab_size) and the parameter counts of the released models
QWEN_VOCAB = {"qwen2.5-0.5b": 151936, "qwen2.5-1.5b": 151936, "qwen2.5-7b": 152064}
PUBLISHED = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512}


def meta_count(name: str, vocab_size: int) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shapes.shape_config(name, vocab_size=vocab_size))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(shapes.SHAPES))
def test_each_shape_has_qwen25s_parameter_count_with_qwens_vocabulary(name):
    assert meta_count(name, QWEN_VOCAB[name]) == PUBLISHED[name] == shapes.parameter_count(name, QWEN_VOCAB[name])


def test_with_smollm2s_vocabulary_the_counts_are_the_ones_the_benchmarks_quote():
    assert meta_count("qwen2.5-0.5b", shapes.SMOLLM2_VOCAB) == shapes.parameter_count("qwen2.5-0.5b") == 401_938_304
    assert round(shapes.parameter_count("qwen2.5-1.5b") / 1e9, 2) == 1.39  # the figure
    assert round(shapes.parameter_count("qwen2.5-7b") / 1e9, 2) == 6.88


def test_a_tiny_shape_is_written_as_a_bf16_folder_with_the_tokenizers_vocabulary(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.testing import build_tiny_model

    tiny_model = build_tiny_model(tmp_path / "tokenizer-source")

    monkeypatch.setitem(shapes.SHAPES, "tiny", (64, 2, 4, 2, 128, True))
    out = shapes.build("tiny", tmp_path / "tiny", device="cpu", tokenizer_from=str(tiny_model))
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == len(tokenizer) == len(AutoTokenizer.from_pretrained(tiny_model))
    assert model.dtype == torch.bfloat16 and list(out.glob("*.safetensors"))
    assert sum(p.numel() for p in model.parameters()) == shapes.parameter_count("tiny", len(tokenizer))
    assert model.config.tie_word_embeddings and model.config.eos_token_id == tokenizer.eos_token_id


def test_no_embedding_row_of_a_built_shape_is_all_zero(tmp_path):
    """transformers zeroes the pad token's row at init, and the shapes' pad is SmolLM2's <|im_end|>, in
    every chat prompt: with it zero the PPO line's gradients overflowed (docs/benchmarks.md)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, pad_token_id=2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    before = model.get_input_embeddings().weight.clone()
    assert (before[2] == 0).all()  # what transformers does: the reason for the fill
    assert shapes.fill_zero_embedding_rows(model) == [2]
    for embedding in (model.get_input_embeddings(), model.get_output_embeddings()):
        assert not (embedding.weight == 0).all(dim=-1).any()
    after = model.get_input_embeddings().weight
    torch.testing.assert_close(after[3:], before[3:])  # the other rows stay as they were
    assert 0.005 < float(after[2].std()) < 0.05  # like the others (initializer_range 0.02)
