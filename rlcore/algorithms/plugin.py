"""The built-in algorithms, registered through the same hooks a third-party plugin uses."""

from rlcore import hookimpl
from rlcore.algorithms import advantages, distillation, kl, policy_losses, rollout_correction
from rlcore.algorithms.advantages import ESTIMATORS
from rlcore.algorithms.kl import KL_ESTIMATORS
from rlcore.algorithms.policy_losses import POLICY_LOSSES
from rlcore.algorithms.rollout_correction import VERL_HOW, VERL_PREFIX, from_verl
from rlcore.plugins.settings import JobCheck, VerlKeys, VerlTable


@hookimpl
def rlcore_register_advantage_estimators(register):
    for name, estimator in ESTIMATORS.items():
        register(name, estimator)


@hookimpl
def rlcore_register_policy_losses(register):
    for name, loss in POLICY_LOSSES.items():
        register(name, loss)


@hookimpl
def rlcore_register_kl_estimators(register):
    for name, estimator in KL_ESTIMATORS.items():
        register(name, estimator)


@hookimpl
def rlcore_register_job_checks(register):
    register("advantage_estimator", JobCheck(problems=advantages.estimator_problems, unused=advantages.estimator_unused))
    register("policy_loss", JobCheck(problems=policy_losses.policy_loss_problems))
    register("kl", JobCheck(unused=kl.kl_unused))
    register("rollout_correction", JobCheck(problems=rollout_correction.problems, unused=rollout_correction.unused))
    register("distillation", JobCheck(problems=distillation.problems, unused=distillation.unused))


@hookimpl
def rlcore_register_verl_keys(register):
    register("rollout_correction", VerlKeys(tables=(VerlTable(VERL_PREFIX, VERL_HOW, from_verl),)))
    register("distillation", distillation.VERL_KEYS)
