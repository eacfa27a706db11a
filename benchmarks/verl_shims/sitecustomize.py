"""Loaded by every Python process of a verl run whose ``PYTHONPATH`` names this folder (``verl_jobs``
does so for every job). Two changes, nothing else:

- verl 0.9.1 loads the critic with ``attn_implementation="flash_attention_2"`` written into
  ``verl.utils.model.load_valuehead_model``, whatever ``critic.model.override_config.attn_implementation``
  says, and its TRL fallback asks for the same, so on a GPU image without flash-attn verl's PPO line cannot
  start. The shim changes that one argument to the implementation the critic's config asks for (``sdpa``
  in the benchmark): the critic is the same model class with the same weights.
- TRL is hidden. The benchmark's environment carries TRL 1.16 for TRL's own rows, and where TRL can be
  found, verl 0.9.1's ``apply_monkey_patch`` (every actor, reference and critic it builds) imports
  ``AutoModelForCausalLMWithValueHead`` from it, which TRL 1.16 no longer has: every verl job stopped at
  its first model (2026-12-06). Without TRL verl skips that patch of a class it does not use.

docs/benchmarks.md says which rows ran with it."""

import importlib.abc
import importlib.util
import sys

_TARGET = "verl.utils.model"


def _critic_loader_with_configured_attention(load):
    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        import transformers

        wanted = getattr(model_config, "_attn_implementation", None) or "sdpa"
        classes = (transformers.AutoModelForTokenClassification, transformers.AutoModelForCausalLM)
        originals = {cls: cls.__dict__.get("from_pretrained") for cls in classes}

        def configured(original):
            def from_pretrained(*args, **kwargs):
                if kwargs.get("attn_implementation") == "flash_attention_2" and wanted != "flash_attention_2":
                    kwargs["attn_implementation"] = wanted
                return original(*args, **kwargs)
            return from_pretrained

        for cls in classes:
            cls.from_pretrained = configured(cls.from_pretrained)
        try:
            return load(local_path, torch_dtype, model_config, trust_remote_code)
        finally:
            for cls, original in originals.items():
                if original is None:
                    del cls.from_pretrained
                else:
                    cls.from_pretrained = original

    return load_valuehead_model


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched_exec(module):
            exec_module(module)
            module.load_valuehead_model = _critic_loader_with_configured_attention(module.load_valuehead_model)

        spec.loader.exec_module = patched_exec
        return spec


sys.meta_path.insert(0, _PatchOnImport())
# None in sys.modules: ``import trl`` raises ModuleNotFoundError, ``importlib.util.find_spec("trl")`` is None
sys.modules["trl"] = None
