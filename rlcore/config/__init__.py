"""Job configuration: TOML + overrides structured into frozen attrs classes (see ``schema``)."""

from rlcore.config.load import Job, load_job
from rlcore.config.schema import JobConfig

__all__ = ["Job", "JobConfig", "load_job"]
