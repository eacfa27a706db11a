"""Fixtures for the sglang engine's tests. The tests that start SGLang skip where it does not import
(it needs a CUDA GPU); ``tests/sglang/test_adapter.py`` runs everywhere against a fake engine."""

from tests.fsdp.conftest import backend, one_thread, platform  # noqa: F401 - shared fixtures

SGLANG_MISSING = ("sglang is not installed here (it needs a CUDA GPU; docs/engines.md, 'SGLang', says which "
                  "versions and wheels)")
