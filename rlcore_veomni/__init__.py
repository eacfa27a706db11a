"""rlcore plugin: the ``veomni`` training backend (the actor and reference on VeOmni's model code and its
FSDP2 parallelisation, inside rlcore's fsdp roles) and its ``[actor.veomni]`` and ``[ref.veomni]`` tables.

Registered through the ``rlcore`` entry-point group like any third-party plugin. Importing this module
imports neither torch nor veomni: the roles, and veomni with them, load only when a job picks the
backend (``trainer.backend = "veomni"``); without veomni that is one error naming the package and the
pip command (``rlcore_veomni.model.import_veomni``).
"""

from rlcore.api import hookimpl
from rlcore_veomni.options import SECTIONS, VeomniOptions


@hookimpl
def rlcore_register_training_backends(register):
    from rlcore_veomni.backend import VeomniBackend

    register("veomni", VeomniBackend())


@hookimpl
def rlcore_register_config_sections(register):
    for section in SECTIONS:
        register(section, VeomniOptions)
