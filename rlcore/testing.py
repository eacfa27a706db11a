"""Tiny models for tests and offline demos: a real Hugging Face folder built from a config.

No hub access is needed: the tokenizer is a byte-level BPE trained here on a small fixed corpus,
with a ChatML chat template, and the model a randomly initialised Qwen2 of ~0.1M parameters.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlcore.plugins.manager import get_manager
from rlcore.runtime.atomic import publish, staging_dir

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "what is the answer to let's think step by step and output final after #### plus minus times "
    "how many does have each total left more less than sum difference product question solution "
    "she he they bought sold apples books dollars hours minutes days week per cost price half twice "
    "user assistant system you are a helpful model compute add subtract multiply divide equals = + - * / "
)


def _corpus() -> list[str]:
    lines = [_WORDS] * 4
    for a in range(0, 100, 7):
        for b in range(0, 100, 11):
            lines.append(f"What is {a} + {b}? {a} + {b} = {a + b}. #### {a + b}")
            lines.append(f"{a} * {b} = {a * b}, {a} - {b} = {a - b}")
    return lines


def build_tiny_tokenizer(vocab_size: int = 512):
    """A ``PreTrainedTokenizerFast`` with a chat template, eos ``<|im_end|>`` and pad ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE,
    )


# Qwen2.5-0.5B's layer shape (hidden 896, 14 query and 2 key/value heads, MLP 4864, 24 layers) for
# checks that need a real model's head layout (tensor parallel 2) but no real weights.
QWEN2_5_0_5B_SHAPE = {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
                      "intermediate_size": 4864}


def save_model_folder(model, tokenizer, directory: Path) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face folder at ``directory``, atomically: the folder
    is either complete or absent."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(directory)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    publish(staging, directory)
    return directory


def build_tiny_model(directory: str | os.PathLike, *, hidden_size: int = 64, num_layers: int = 2,
                     vocab_size: int = 512, seed: int = 0, num_heads: int = 4, num_kv_heads: int = 2,
                     intermediate_size: int | None = None, family: str = "qwen2") -> Path:
    """Write a random Qwen2 (or, ``family="llama"``, Llama: SmolLM2's; ``"qwen3_moe"``, a Qwen3 mixture of
    experts with 4 experts, 2 per token, in every layer) causal LM (tiny by default; any layer shape, e.g.
    ``**QWEN2_5_0_5B_SHAPE``) and its tokenizer as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

    directory = Path(directory)
    tokenizer = build_tiny_tokenizer(vocab_size)
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": hidden_size,
               "decoder_sparse_step": 1} if family == "qwen3_moe" else {}
    config = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}[family](
        **experts, vocab_size=len(tokenizer), hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return save_model_folder(model, tokenizer, directory)


def build_tiny_reward_model(directory: str | os.PathLike, *, hidden_size: int = 64, seed: int = 1) -> Path:
    """Write a tiny random Qwen2 reward model (sequence classification, one label) and its tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    return save_model_folder(model, tokenizer, directory)


def build_actor(backend, config, platform):
    """``backend``'s actor for ``config`` with the spec a job's driver computes for it (``rlcore.training.specs``,
    its algorithm objects from ``rlcore.training.backends.resolve_actor_algorithms``): for tests and scripts that
    build an actor alone."""
    # torch: when a role is built, not when a test imports this module
    from rlcore.training.backends import resolve_actor_algorithms
    from rlcore.training.specs import actor_spec

    return backend.actor(actor_spec(config, resolve_actor_algorithms(config, get_manager())), platform)


def build_reference(backend, config, platform):
    """``backend``'s reference for ``config``, built from the spec a job's driver computes for it."""
    from rlcore.training.specs import reference_spec

    return backend.reference(reference_spec(config), platform)


def build_critic(backend, config, platform):
    """``backend``'s critic for ``config``, built from the spec a job's driver computes for it."""
    from rlcore.training.specs import critic_spec

    return backend.critic(critic_spec(config), platform)


def build_rollout(engine, config, platform, actor):
    """The rollout ``engine`` (a registered ``RolloutEngine``, or an engine class taking a spec) builds for
    ``config``, beside ``actor``, from the spec a job's driver computes for it."""
    from rlcore.training.specs import rollout_spec

    return engine(rollout_spec(config), platform, actor)


# -- a tiny vision-language model ------------------------------------------------------------------------
# Qwen2-VL's vision special tokens, and a ChatML template (SmolLM2's, with its system line) that places
# them where a message part is an image, as Qwen2-VL's own template does.
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_vision_model(directory: str | os.PathLike, *, hidden_size: int = 64, num_layers: int = 2,
                            vision_depth: int = 2, vision_dim: int = 32, max_image_side: int = 56,
                            seed: int = 0, family: str = "qwen2_vl") -> Path:
    """Write a random Qwen2-VL-shaped model (``family="qwen2_5_vl"``: Qwen2.5-VL's, whose vision tower
    attends in windows of 2 x 2 merged patches but in its last block; "qwen3_vl": Qwen3-VL's; "qwen3_vl_moe":
    Qwen3-VL-MoE's, 4 experts of which each token takes 2 in every layer; built from its config: a
    ``vision_depth``-layer vision tower, a ``num_layers``-layer language model) with what its processor needs as a
    Hugging Face folder: ``preprocessor_config.json`` with Qwen2-VL's image-processor defaults (its Pillow
    path: torchvision is not needed), except that an image becomes at most ``max_image_side`` squared
    pixels (a 56 x 56 image: 16 patches of 14, 4 image tokens), SmolLM2's tokenizer (the embedded model's) with Qwen2-VL's vision tokens added,
    and a chat template that places them."""
    qwen3 = family in ("qwen3_vl", "qwen3_vl_moe")
    num_heads, patch, merge = 4, 16 if qwen3 else 14, 2
    half_head = hidden_size // num_heads // 2  # the 3-D rotary sections (time, height, width) split it
    text = {"hidden_size": hidden_size, "intermediate_size": 2 * hidden_size, "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads, "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "mrope_section": [half_head - 2 * (half_head // 3), half_head // 3, half_head // 3]}
    vision = {"depth": vision_depth, "num_heads": 2}
    if qwen3:  # Qwen3's text config names its head size (default 128)
        text["head_dim"] = hidden_size // num_heads
    if family == "qwen3_vl_moe":
        text |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": hidden_size,
                 "decoder_sparse_step": 1}
    if family == "qwen2_5_vl":
        vision |= {"hidden_size": vision_dim, "intermediate_size": 2 * vision_dim,
                   "window_size": 2 * patch * merge, "fullatt_block_indexes": [vision_depth - 1]}
    elif qwen3:  # learned position embeddings over a 16 x 16 grid; deepstack from block 0
        vision |= {"hidden_size": vision_dim, "intermediate_size": 2 * vision_dim, "num_position_embeddings": 256,
                   "deepstack_visual_indexes": [0]}
    else:  # Qwen2-VL names the vision width embed_dim
        vision |= {"embed_dim": vision_dim, "mlp_ratio": 2}
    return build_vision_model(directory, family=family, text=text, vision=vision, max_image_side=max_image_side,
                              seed=seed)


def build_vision_model(directory: str | os.PathLike, *, family: str, text: dict, vision: dict,
                       max_image_side: int | None = None, seed: int = 0, dtype=None, device: str = "cpu") -> Path:
    """Write a random Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3-VL-MoE (``family``: "qwen2_vl", "qwen2_5_vl",
    "qwen3_vl", "qwen3_vl_moe"; the MoE's ``text`` adds num_experts, num_experts_per_tok, moe_intermediate_size) of
    the given sizes as a
    Hugging Face folder: ``text`` the language model's (hidden_size, intermediate_size, num_hidden_layers,
    num_attention_heads, num_key_value_heads, max_position_embeddings, mrope_section), ``vision`` the vision
    tower's (Qwen2.5-VL: depth, hidden_size, intermediate_size, num_heads, window_size,
    fullatt_block_indexes; Qwen2-VL: depth, embed_dim, mlp_ratio, num_heads), its output width the language
    model's. Patches of 14, 2 x 2 merged, tied embeddings, rope theta 1e6; an image becomes at most
    ``max_image_side`` squared pixels (None: the family's default, 12.8 M); SmolLM2's tokenizer with the
    vision tokens and a chat template that places them; the weights in ``dtype`` (default fp32), drawn on
    ``device``."""
    import torch
    from transformers import (AutoModelForImageTextToText, AutoTokenizer, Qwen2_5_VLConfig, Qwen2VLConfig,
                              Qwen3VLConfig, Qwen3VLMoeConfig)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlcore.models.loading import materialize_embedded

    directory = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(materialize_embedded())
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in VISION_TOKENS}
    qwen3 = family in ("qwen3_vl", "qwen3_vl_moe")
    patch, merge = (16 if qwen3 else 14), 2
    size = {"shortest_edge": (patch * merge) ** 2, "longest_edge": (max_image_side or 3584) ** 2}
    image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=2, size=size)
    text = dict(text)
    mrope_section = text.pop("mrope_section")
    vision = {"patch_size": patch, "spatial_merge_size": merge, "temporal_patch_size": 2, "in_channels": 3,
              **vision}
    if family != "qwen2_vl":
        vision["out_hidden_size"] = text["hidden_size"]
    else:  # Qwen2-VL names its vision tower's output width hidden_size
        vision["hidden_size"] = text["hidden_size"]
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope_section}
    if qwen3:  # its 3-D sections interleaved over the rotary dims
        rope["mrope_interleaved"] = True
    configs = {"qwen2_vl": Qwen2VLConfig, "qwen2_5_vl": Qwen2_5_VLConfig, "qwen3_vl": Qwen3VLConfig,
               "qwen3_vl_moe": Qwen3VLMoeConfig}
    config = configs[family](
        text_config={"vocab_size": len(tokenizer), **text,
                     "rope_parameters": rope,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                     "bos_token_id": None, "tie_word_embeddings": True},
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype or torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(directory)
    model.save_pretrained(staging)
    # no processor_config.json: transformers' Qwen2VLProcessor wants a video processor, which needs
    # torchvision; rlcore puts an image's tokens into the prompt itself (rlcore.data.vision)
    tokenizer.save_pretrained(staging)
    image_processor.save_pretrained(staging)
    publish(staging, directory)
    return directory
