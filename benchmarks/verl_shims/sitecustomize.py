"""Loaded by every Python process of a verl run whose ``PYTHONPATH`` names this folder (``verl_jobs``
does so for the PPO line only): verl 0.9.1 loads the critic with ``attn_implementation=
"flash_attention_2"`` written into ``verl.utils.model.load_valuehead_model``, whatever
``critic.model.override_config.attn_implementation`` says, and its TRL fallback asks for the same, so
on a GPU image without flash-attn verl's PPO line cannot start. This shim changes that one argument to
the implementation the critic's config asks for (``sdpa`` in the benchmark), nothing else: the critic
is the same model class with the same weights. docs/benchmarks.md says which rows ran with it."""

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
