"""rlcore: reinforcement-learning post-training of LLMs as a small core plus plugins."""

from importlib.metadata import PackageNotFoundError, version

from rlcore.plugins.hookspecs import hookimpl

try:
    __version__ = version("rlcore")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "hookimpl"]
