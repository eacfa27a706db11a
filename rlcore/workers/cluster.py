"""Start a local Ray instance or join a cluster (``trainer.ray_address`` or ``RAY_ADDRESS``)."""

from __future__ import annotations

import os
import shutil
import tempfile

from rlcore.config.schema import JobConfig
from rlcore.plugins.manager import get_manager
from rlcore.runtime.platforms import current_platform
from rlcore.runtime.stopping import keep_handlers

# Passed to every worker so plugin selection and platform forcing are the same everywhere.
FORWARDED_ENV = ("RLCORE_PLATFORM", "RLCORE_PLUGINS", "RLCORE_DISABLE_PLUGIN_AUTOLOAD", "RLCORE_CACHE",
                 "PYTHONPATH", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def worker_env() -> dict[str, str]:
    return {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}


def shipped_modules() -> list:
    """rlcore and its built-in plugin packages, as loaded in the driver."""
    import importlib

    names = {"rlcore"} | {p.entry_point.split("=")[1].strip().split(".")[0].split(":")[0]
                          for p in get_manager().loaded if p.entry_point and p.provider.distribution == "rlcore"}
    return [importlib.import_module(name) for name in sorted(names)]


class RayCluster:
    """A context manager: joins or starts Ray, and shuts down only what it started."""

    def __init__(self, config: JobConfig):
        self.address = config.trainer.ray_address or os.environ.get("RAY_ADDRESS") or None
        self.started = False
        self.temp_dir: str | None = None

    def __enter__(self) -> RayCluster:
        import ray

        if ray.is_initialized():
            return self

        current_platform().reconcile_visible_devices(os.environ)
        runtime_env: dict = {"env_vars": worker_env()}
        if self.address:
            # Every node runs the driver's rlcore code (rlcore itself must be installed there too,
            # so that its plugins' entry points are found).
            runtime_env["py_modules"] = shipped_modules()
            with keep_handlers():  # Ray's own SIGTERM handler aborts the driver: keep the job's (rlcore.runtime.stopping)
                ray.init(address=self.address, runtime_env=runtime_env, log_to_driver=True)
        else:
            # A private temp dir: Ray's default (/tmp/ray) is shared by every Ray on the machine, and
            # two local instances there can disturb each other.
            self.temp_dir = tempfile.mkdtemp(prefix="rlcore-ray-")
            with keep_handlers():
                ray.init(include_dashboard=False, runtime_env=runtime_env, log_to_driver=True,
                         configure_logging=True, logging_level="WARNING", _temp_dir=self.temp_dir)
        self.started = True
        return self

    def __exit__(self, *exc) -> None:
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
