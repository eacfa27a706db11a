from tests.fsdp.conftest import backend, one_thread, platform, tiny_model_path  # noqa: F401 - shared fixtures
