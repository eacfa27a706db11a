"""rlcore plugin: the ``torchtitan`` training backend (the actor and reference on torchtitan's own model
code and its FSDP2 parallelisation) and its ``[actor.torchtitan]`` and ``[ref.torchtitan]`` tables.

Registered through the ``rlcore`` entry-point group like any third-party plugin. Importing this module
imports neither torch nor torchtitan: the roles, and torchtitan with them, load only when a job picks
the backend (``trainer.backend = "torchtitan"``); without torchtitan that is one error naming the
package and the pip command (``rlcore_torchtitan.model.import_torchtitan``).
"""

from rlcore.api import JobCheck, hookimpl
from rlcore_torchtitan.options import SECTIONS, TorchtitanOptions


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_torchtitan.backend import TorchtitanBackend

    register("torchtitan", TorchtitanBackend())


@hookimpl
def rlcore_register_config_sections(register):
    for section in SECTIONS:
        register(section, TorchtitanOptions)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore_torchtitan.checks import unused

    register("torchtitan", JobCheck(unused=unused))


@hookimpl
def rlcore_register_verl_keys(register):
    from rlcore_torchtitan.verl import VERL_KEYS

    register("torchtitan", VERL_KEYS)
