"""The veomni plugin with or without veomni: it imports without it, `rlcore plugins` lists the backend and
its tables, and a job on it without veomni is one error naming the package and the pip command."""

from __future__ import annotations

import json
import sys

import pytest

from rlcore.config import load_job
from rlcore.errors import RlcoreError
from rlcore.plugins.manager import get_manager
from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore_veomni.backend import VeomniBackend
from rlcore_veomni.options import VeomniOptions
from tests.conftest import REPO, run_rlcore
from tests.processes import run_process

HIDDEN = "import sys; sys.modules['veomni'] = None\n"  # `import veomni` raises ImportError


def test_the_package_imports_without_veomni():
    code = (HIDDEN + "import rlcore_veomni, rlcore_veomni.backend, rlcore_veomni.options\n"
            "assert not any(m.startswith('veomni') for m in sys.modules if sys.modules[m])\n")
    result = run_process([sys.executable, "-c", code], name="import of rlcore_veomni without veomni", timeout=120)
    assert result.returncode == 0, result.stderr


def test_rlcore_plugins_lists_the_backend_and_its_tables():
    result = run_rlcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "veomni"]
    assert plugin["registered"] == {"config_sections": ["actor.veomni", "ref.veomni"], "training_backends": ["veomni"]}
    assert isinstance(get_manager().get("training_backends", "veomni"), VeomniBackend)


def test_its_tables_are_read_and_checked():
    config = load_job(None, ["trainer.backend=veomni", "actor.veomni.kernels=liger_kernel"], check=False).config
    assert config.section("actor.veomni") == VeomniOptions(kernels="liger_kernel")
    with pytest.raises(RlcoreError, match="attn_implementation"):
        load_job(None, ["actor.veomni.attn_implementation=fast"], check=False)


@pytest.mark.parametrize("role", ["actor", "reference"])
def test_a_missing_veomni_is_one_error_with_the_install_command(monkeypatch, role):
    monkeypatch.setitem(sys.modules, "veomni", None)
    config = load_job(None, ["trainer.backend=veomni"], check=False).config
    build = {"actor": build_actor, "reference": build_reference}[role]
    with pytest.raises(RlcoreError, match=r"needs the veomni package.*pip install 'rlcore\[veomni\]'"):
        build(VeomniBackend(), config, CpuPlatform())


def test_a_job_on_it_without_veomni_is_refused_before_it_starts(tmp_path):
    """`rlcore config validate` in a process where veomni does not import: the job's libraries are checked
    with the rest of the machine (rlcore.runs.preflight)."""
    code = HIDDEN + ("from rlcore.cli import entry_point\n"
                     "sys.argv = ['rlcore', 'config', 'validate', 'trainer.backend=veomni', 'model.path=" +
                     str(tmp_path) + "']\nentry_point()\n")
    result = run_process([sys.executable, "-c", code], name="rlcore config validate without veomni",
                         timeout=120, cwd=str(REPO))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "trainer.backend = 'veomni': veomni is not installed (pip install 'rlcore[veomni]')" \
        in result.stdout + result.stderr


def test_it_has_no_critic_and_a_job_that_needs_one_is_refused():
    config = load_job(None, ["trainer.backend=veomni"], check=False).config
    with pytest.raises(RlcoreError, match="builds no critic"):
        build_critic(VeomniBackend(), config, CpuPlatform())
    with pytest.raises(RlcoreError, match=r"algorithm.adv_estimator = 'gae' trains a critic, and trainer.backend = "
                                          r"'veomni' builds none: use an estimator without one \('grpo', 'rloo', \.\.\.\), or use "
                                          r"trainer.backend = one of 'fsdp'"):
        load_job(None, ["trainer.backend=veomni", "algorithm.adv_estimator=gae"])


@pytest.mark.parametrize("override, named", [
    ("model.lora_rank=8", "model.lora_rank"),
    ("actor.ulysses_sequence_parallel_size=2", "ulysses_sequence_parallel_size"),
    ("actor.router_replay=R2", "actor.router_replay"),
])
def test_what_it_does_not_do_is_refused_naming_the_setting(override, named):
    with pytest.raises(RlcoreError, match=f"{named}.*'veomni' training backend does not"):
        load_job(None, ["trainer.backend=veomni", override])
