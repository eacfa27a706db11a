"""Training backends and rollout engines read no ``JobConfig``: their builders receive a role spec
(``rlcore.api.ActorSpec``, ``ReferenceSpec``, ``CriticSpec``, ``RolloutSpec``) that the driver computed.

The packages of the backends and engines (the built-in plugins, the third-party-style ones under
``plugins/``, and the ``hf`` engine in ``rlcore/rollout``) never import ``rlcore.config``, never name
``JobConfig`` (an import, a hint, a string), and never read a setting of a table that only the whole job
has (``trainer.seed``, ``data.max_response_length``, ``distillation.topk``, ...) except in a job check,
off its ``job.config``; and the builders' contracts take specs."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import attrs

import rlcore.api
from rlcore.config.schema import JobConfig
from rlcore.training.backends import TrainingBackend
from rlcore.training.specs import ActorSpec, CriticSpec, ReferenceSpec, RolloutSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
ENGINE_MODULES = ("rlcore/rollout/hf.py",)  # the core's own engine: a plugin in all but its package
# the job's tables no spec carries, with their settings: ``<x>.trainer.seed`` off anything but a job check's
# ``job.config`` reads the job (``param.data.copy_`` reads no setting)
SPEC_TABLES = {"model", "actor", "rollout", "critic", "sections"}
JOB_ONLY = {field.name: {setting.name for setting in attrs.fields(field.type)}
            for field in attrs.fields(JobConfig) if field.name not in SPEC_TABLES}


def backend_and_engine_files() -> list[Path]:
    packages = sorted(p for p in ROOT.glob("rlcore_*") if (p / "__init__.py").is_file())
    packages += sorted(p for p in ROOT.glob("plugins/*") if p.is_dir())
    files = [path for package in packages for path in sorted(package.rglob("*.py"))
             if "build" not in path.relative_to(package).parts]  # a local `pip install` copy, not the source
    return files + [ROOT / name for name in ENGINE_MODULES]


def offences(source: str) -> list[tuple[int, str]]:
    """(line, what) of each way ``source`` reaches the whole job."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "rlcore.config" or node.module.startswith("rlcore.config."):
                found.append((node.lineno, f"imports {node.module}"))
            found += [(node.lineno, "imports JobConfig") for alias in node.names if alias.name == "JobConfig"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {alias.name}") for alias in node.names
                      if alias.name == "rlcore.config" or alias.name.startswith("rlcore.config.")]
        elif isinstance(node, ast.Name) and node.id == "JobConfig":
            found.append((node.lineno, "names JobConfig"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "JobConfig" in node.value:
            found.append((node.lineno, "names JobConfig in a string"))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and node.attr in JOB_ONLY.get(node.value.attr, ()) and not _of_a_job_check(node.value.value)):
            found.append((node.lineno, f"reads {node.value.attr}.{node.attr}, a setting only the whole job has"))
    return found


def _of_a_job_check(node: ast.expr) -> bool:
    """``job.config``: what a registered job check (``rlcore.api.JobCheck``) reads, the one place a plugin
    sees the whole job (it checks it, it builds nothing)."""
    return (isinstance(node, ast.Attribute) and node.attr == "config" and isinstance(node.value, ast.Name)
            and node.value.id == "job")


def test_the_checked_files_are_found():
    names = {path.relative_to(ROOT).parts[0] for path in backend_and_engine_files()}
    assert {"rlcore_fsdp", "rlcore_megatron", "rlcore_vllm", "rlcore_sglang", "rlcore_rocm", "rlcore_ascend",
            "plugins", "rlcore"} <= names
    assert {"trainer", "data", "algorithm", "distillation", "ref"} <= set(JOB_ONLY)


def test_backends_and_engines_never_read_the_whole_job():
    found = [f"{path.relative_to(ROOT)}:{line} {what}" for path in backend_and_engine_files()
             for line, what in offences(path.read_text(encoding="utf-8"))]
    assert not found, ("backends and engines read their role spec, never the job (rlcore.training.specs):\n"
                       + "\n".join(found))


def test_the_check_sees_each_way_of_reaching_the_job():
    assert offences("from rlcore.config.schema import ModelConfig")[0][1] == "imports rlcore.config.schema"
    assert offences("import rlcore.config")[0][1] == "imports rlcore.config"
    assert offences("from rlcore.api import JobConfig")[0][1] == "imports JobConfig"
    assert offences("def build(config: JobConfig): ...")[0][1] == "names JobConfig"
    assert offences("def build(config: 'JobConfig'): ...")[0][1] == "names JobConfig in a string"
    assert offences("seed = config.trainer.seed")[0][1] == "reads trainer.seed, a setting only the whole job has"
    assert offences("length = self.config.data.max_response_length")[0][1].startswith("reads data.max_response_length")
    assert offences("weights = param.data.clone()") == []
    assert offences("def problems(job):\n    return job.config.trainer.nnodes") == []  # a job check
    assert offences("seed = spec.seed\nsize = spec.rollout.n") == []


def test_the_plugin_api_hands_out_specs_not_the_job():
    assert "JobConfig" not in rlcore.api.__all__
    assert {"TrainingSpec", "ActorSpec", "ReferenceSpec", "CriticSpec", "RolloutSpec"} <= set(rlcore.api.__all__)
    for role, spec in (("actor", ActorSpec), ("reference", ReferenceSpec), ("critic", CriticSpec)):
        assert list(inspect.signature(getattr(TrainingBackend, role)).parameters) == ["self", "spec", "platform"]
        assert issubclass(spec, TrainingSpec)
    assert list(inspect.signature(TrainingBackend.data_parallel_ranks).parameters) == ["self", "spec", "workers"]
    assert [field.name for field in attrs.fields(RolloutSpec)][:2] == ["rollout", "model"]
