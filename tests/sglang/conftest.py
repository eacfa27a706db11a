from tests.fsdp.conftest import backend, one_thread, platform  # noqa: F401 - shared fixtures
