"""The tiny models the engine tests (vllm, sglang) and the multi-turn jobs generate with."""

from __future__ import annotations

from pathlib import Path


def build_engine_model(directory: Path) -> Path:
    """A tiny Qwen2 that vLLM's CPU attention accepts (head size 32: it refuses 16), its weights drawn
    wide enough (std 0.3) that greedy decoding varies and the top two logits stay well apart."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_model

    path = build_tiny_model(directory, hidden_size=128)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return drawn_wide(model, path)


def build_tool_using_model(directory: Path, call: str, result: str, answer: str, *, alpha: float = 6.0) -> Path:
    """A tiny Qwen2 (one layer, head size 32 as vLLM's CPU attention needs, untied head) whose
    generations are known in advance, set by hand in its weights: each assistant turn writes
    ``<tool_call>`` ``call`` ``</tool_call>`` and its eos, unless the text ``result`` (a tool's answer)
    is somewhere in the conversation; then it writes ``answer`` and its eos. So in a multi-turn job its
    first turn calls the tool, and its second turn answers only if the call ran and its result came
    back. Its tokenizer is the tiny test tokenizer with those texts added as tokens of their own.

    How: the MLP and every attention head but one add nothing (zero output projections), so the
    hidden state is the current token's embedding, read by the head as a table of next tokens (a
    bigram). The one head looks, from the token that opens an assistant turn, at ``result``'s token
    (on the lowest rotary frequency, where positions barely turn the vectors), and adds a direction
    that the head reads as ``answer``. Logits of the next token win by about 8 x ``alpha`` (48 by
    default): sampling at temperature 1 draws it, and a few small updates do not change it."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlcore.testing import build_tiny_tokenizer, save_model_folder

    tokenizer = build_tiny_tokenizer()
    pieces = ["<tool_call>", call, "</tool_call>", answer, result]
    if len(set(pieces)) != len(pieces) or tokenizer.add_tokens(pieces) != len(pieces):
        raise ValueError(f"the model's texts must be new to the tokenizer and distinct: {pieces}")
    opening, called, closing, answered, seen = tokenizer.convert_tokens_to_ids(pieces)
    turn = tokenizer.apply_chat_template([{"role": "user", "content": "u"}], tokenize=True,
                                         add_generation_prompt=True, return_dict=False)[-1]  # "\n" of "assistant\n"
    eos = tokenizer.eos_token_id
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1e6,
                         tie_word_embeddings=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # hidden dimensions: one per token of the script (the bigram's rows), QUERY on the turn's opening,
    # RESULT on the result's token, SEEN: the head's output, read as "answer now"
    row = {turn: 0, opening: 1, called: 2, closing: 3, answered: 4}
    query_dim, result_dim, seen_dim = 5, 6, 7
    low = config.hidden_size // config.num_attention_heads // 2 - 1  # the rotary pair (low, low + head_dim / 2) that turns slowest
    layer = model.model.layers[0]
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[:, :8] = 0.0  # no other token touches the script's dimensions
        for token, dim in row.items():
            embedding[token] = 0.0
            embedding[token, dim] = 1.0
        embedding[turn, query_dim] = 1.0
        embedding[seen] = 0.0
        embedding[seen, result_dim] = 1.0
        attention = layer.self_attn
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
            projection.weight.zero_()
            if projection.bias is not None:
                projection.bias.zero_()
        # after the input norm the opening token holds 8 on QUERY, the result's 11.3 on RESULT: score
        # 8 x 1.58 x 11.3 x 1.58 / sqrt(32) = 40 on the result, 0 elsewhere
        attention.q_proj.weight[low, query_dim] = 1.58
        attention.k_proj.weight[low, result_dim] = 1.58
        attention.v_proj.weight[0, result_dim] = 1.0
        attention.o_proj.weight[seen_dim, 0] = 10.0 / 128 ** 0.5  # the result seen: 10 along SEEN
        layer.mlp.down_proj.weight.zero_()
        head = model.lm_head.weight
        head.zero_()
        head[opening, row[turn]] = alpha  # the turn opens: call the tool
        head[called, row[opening]] = alpha
        head[closing, row[called]] = alpha
        head[eos, row[closing]] = alpha
        head[answered, seen_dim] = alpha  # the result is in the conversation: answer instead
        head[eos, row[answered]] = alpha
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = eos
    return save_model_folder(model, tokenizer, directory)


# GSM8K-like and plain questions for the engines' GPU tests on the real SmolLM2 (tests/*/test_on_gpu.py)
SMOLLM2_QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?",
    "What is 17 + 25?", "Name three primary colors.", "Write a haiku about autumn.",
    "Betty has 5 apples and buys 7 more. How many apples does she have?"]


def smollm2_prompts(model: str):
    """``SMOLLM2_QUESTIONS`` through the model's chat template, left-padded, as a prompt ``Batch``."""
    from rlcore.batch import Batch
    from rlcore.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in SMOLLM2_QUESTIONS]
    tokenizer.padding_side = "left"
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def drawn_wide(model, path: Path) -> Path:
    """``model``'s 2-D weights drawn again, normal with std 0.3 (seeded), saved to ``path``: wide enough that a
    random model's greedy decoding varies and its top two logits stay well apart."""
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path


def build_engine_vision_model(directory: Path, family: str = "qwen2_vl") -> Path:
    """A tiny Qwen2-VL (``family``: or Qwen2.5-VL, Qwen3-VL; ``rlcore.testing.build_tiny_vision_model``) that vLLM's CPU attention accepts (head size
    32), its 2-D weights drawn wide (std 0.3, as ``build_engine_model``'s) so that greedy decoding varies and
    an image's pixels move the logits."""
    import torch
    from transformers import AutoModelForImageTextToText

    from rlcore.testing import build_tiny_vision_model

    path = build_tiny_vision_model(directory, hidden_size=128, family=family, max_image_side=64)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    return drawn_wide(model, path)
