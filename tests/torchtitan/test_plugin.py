"""The torchtitan plugin with or without torchtitan: it imports without it, `rlcore plugins` lists the
backend and its tables, and a job on it without torchtitan is one error naming the package and the
pip command."""

from __future__ import annotations

import json
import sys

import pytest

from rlcore.config import load_job
from rlcore.errors import RlcoreError
from rlcore.runtime.platforms import CpuPlatform
from rlcore.plugins.manager import get_manager
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore_torchtitan.backend import TorchtitanBackend
from rlcore_torchtitan.options import TorchtitanOptions
from tests.conftest import REPO, run_rlcore
from tests.processes import run_process

HIDDEN = "import sys; sys.modules['torchtitan'] = None\n"  # `import torchtitan` raises ImportError


def test_the_package_imports_without_torchtitan():
    code = (HIDDEN + "import rlcore_torchtitan, rlcore_torchtitan.backend, rlcore_torchtitan.options\n"
            "assert not any(m.startswith('torchtitan') for m in sys.modules if sys.modules[m])\n")
    result = run_process([sys.executable, "-c", code], name="import of rlcore_torchtitan without torchtitan",
                         timeout=120)
    assert result.returncode == 0, result.stderr


def test_rlcore_plugins_lists_the_backend_and_its_tables():
    result = run_rlcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "torchtitan"]
    assert plugin["registered"] == {"config_sections": ["actor.torchtitan", "ref.torchtitan"],
                                    "job_checks": ["torchtitan"], "training_backends": ["torchtitan"],
                                    "verl_keys": ["torchtitan"]}
    assert isinstance(get_manager().get("training_backends", "torchtitan"), TorchtitanBackend)


def test_its_tables_are_read_and_checked():
    config = load_job(None, ["trainer.backend=torchtitan", "actor.torchtitan.fsdp_reshard_after_forward=never"],
                      check=False).config
    assert config.section("actor.torchtitan") == TorchtitanOptions(fsdp_reshard_after_forward="never")
    with pytest.raises(RlcoreError, match="fsdp_reshard_after_forward"):
        load_job(None, ["actor.torchtitan.fsdp_reshard_after_forward=sometimes"], check=False)


@pytest.mark.parametrize("role", ["actor", "reference"])
def test_a_missing_torchtitan_is_one_error_with_the_install_command(monkeypatch, role):
    monkeypatch.setitem(sys.modules, "torchtitan", None)
    monkeypatch.setitem(sys.modules, "torchtitan.models", None)
    config = load_job(None, ["trainer.backend=torchtitan"], check=False).config
    build = {"actor": build_actor, "reference": build_reference}[role]
    with pytest.raises(RlcoreError, match=r"needs the torchtitan package.*pip install 'rlcore\[torchtitan\]'"):
        build(TorchtitanBackend(), config, CpuPlatform())


def test_a_job_on_it_without_torchtitan_is_refused_before_it_starts(tmp_path):
    """`rlcore config validate` in a process where torchtitan does not import: the job's libraries are
    checked with the rest of the machine (rlcore.runs.preflight)."""
    code = HIDDEN + ("from rlcore.cli import entry_point\n"
                     "sys.argv = ['rlcore', 'config', 'validate', 'trainer.backend=torchtitan', 'model.path=" +
                     str(tmp_path) + "']\nentry_point()\n")
    result = run_process([sys.executable, "-c", code], name="rlcore config validate without torchtitan",
                         timeout=120, cwd=str(REPO))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "trainer.backend = 'torchtitan': torchtitan is not installed (pip install 'rlcore[torchtitan]')" \
        in result.stdout + result.stderr


def test_it_has_no_critic():
    config = load_job(None, ["trainer.backend=torchtitan"], check=False).config
    with pytest.raises(RlcoreError, match="has no critic"):
        build_critic(TorchtitanBackend(), config, CpuPlatform())


def test_a_job_that_needs_a_critic_is_refused_and_packing_is_said_to_do_nothing():
    with pytest.raises(RlcoreError, match="algorithm.adv_estimator = 'gae' trains a critic, and trainer.backend = "
                                          "'torchtitan' builds none"):
        load_job(None, ["trainer.backend=torchtitan", "algorithm.adv_estimator=gae"])
    job = load_job(None, ["trainer.backend=torchtitan", "algorithm.adv_estimator=grpo", "rollout.n=2",
                          "model.use_remove_padding=true"])
    assert any(w.startswith("model.use_remove_padding has no effect with trainer.backend = 'torchtitan'")
               for w in job.warnings), job.warnings


def test_rlcore_plugins_says_the_backend_is_not_ready_without_torchtitan():
    code = HIDDEN + "from rlcore.cli import entry_point\nsys.argv = ['rlcore', 'plugins']\nentry_point()\n"
    result = run_process([sys.executable, "-c", code], name="rlcore plugins without torchtitan", timeout=120,
                         cwd=str(REPO))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torchtitan: NOT READY, torchtitan is not installed (pip install 'rlcore[torchtitan]')" in result.stdout


def test_an_installed_torchtitan_that_does_not_import_is_not_called_missing(monkeypatch):
    """On the GPU machine (torch 2.11) torchtitan 0.3.0 is installed but its import fails inside: the error says
    so and names this torch, rather than asking to install what is installed."""
    import builtins

    from rlcore_torchtitan.model import import_torchtitan

    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name.startswith("torchtitan"):
            raise ImportError("cannot import name 'DataParallelMeshDims' from 'torch.distributed.fsdp'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(RlcoreError, match="torchtitan is installed but does not import here .*DataParallelMeshDims"
                                          ".*This environment's torch is"):
        import_torchtitan()

    def missing(name, *args, **kwargs):
        if name.startswith("torchtitan"):
            raise ModuleNotFoundError("No module named 'torchtitan'", name="torchtitan")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", missing)
    with pytest.raises(RlcoreError, match="which is not installed here; install it with"):
        import_torchtitan()


def test_a_torch_without_data_parallel_mesh_dims_gets_a_stand_in_that_refuses_to_be_built(monkeypatch):
    """torchtitan 0.3.0 imports torch.distributed.fsdp.DataParallelMeshDims (torch >= 2.12) when it loads; under
    torch 2.11 (the GPU image's) the name gets a stand-in so that the import succeeds, and building one (which
    rlcore's path never does) is an error naming it; a torch that has the class keeps its own."""
    import torch.distributed.fsdp as fsdp

    from rlcore_torchtitan.model import stand_in_for_newer_torch

    own = getattr(fsdp, "DataParallelMeshDims", None)
    if own is not None:
        stand_in_for_newer_torch()
        assert fsdp.DataParallelMeshDims is own
        monkeypatch.delattr(fsdp, "DataParallelMeshDims")
    stand_in_for_newer_torch()
    assert fsdp.DataParallelMeshDims.rlcore_stand_in
    from torch.distributed.fsdp import DataParallelMeshDims  # what torchtitan's modules do

    with pytest.raises(RlcoreError, match=r"full-DTensor data parallelism needs torch >= 2.12 "
                                          r"\(torch.distributed.fsdp.DataParallelMeshDims\); this torch is"):
        DataParallelMeshDims(shard="fsdp")
