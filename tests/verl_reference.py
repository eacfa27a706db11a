"""verl 0.9.1's own modules, for the tests that compare rlcore with verl's code: the PyPI wheel,
installed without its dependencies (the README's test command: ``pip install --no-deps verl==0.9.1``;
the few that ``core_algos.py`` imports come with the ``[test]`` extra). Nothing of verl is stubbed.
Outside CI a missing verl skips the calling module, saying why; under ``.ci/run`` (``RLCORE_CI=1``)
it fails, so that CI cannot stay green by skipping the comparison."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import IN_CI

VERL_VERSION = "0.9.1"


def import_verl() -> SimpleNamespace:
    """core_algos, torch_functional, ActorConfig and PolicyLossConfig of verl 0.9.1; else skip (fail in CI)."""
    why = None
    try:
        import verl
        import verl.trainer.ppo.core_algos as core_algos
        import verl.utils.torch_functional as torch_functional
        from verl.workers.config import ActorConfig, PolicyLossConfig
    except ImportError as error:
        why = f"verl {VERL_VERSION} is not importable ({error})"
    else:
        if verl.__version__ != VERL_VERSION:
            why = f"verl {verl.__version__} is installed; the comparison is written against {VERL_VERSION}"
    if why is not None:
        why += f": pip install -e '.[test]' && pip install --no-deps verl=={VERL_VERSION} (the README's test command)"
        if IN_CI:
            pytest.fail(f"{why}; CI (RLCORE_CI=1) must run the comparison with verl", pytrace=False)
        pytest.skip(why, allow_module_level=True)
    return SimpleNamespace(core_algos=core_algos, torch_functional=torch_functional, ActorConfig=ActorConfig,
                           PolicyLossConfig=PolicyLossConfig)
