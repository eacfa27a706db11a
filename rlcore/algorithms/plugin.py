"""The built-in algorithms, registered through the same hooks a third-party plugin uses."""

from rlcore import hookimpl


@hookimpl
def rlcore_register_advantage_estimators(register):
    from rlcore.algorithms.advantages import ESTIMATORS

    for name, estimator in ESTIMATORS.items():
        register(name, estimator)


@hookimpl
def rlcore_register_policy_losses(register):
    from rlcore.algorithms.policy_losses import POLICY_LOSSES

    for name, loss in POLICY_LOSSES.items():
        register(name, loss)


@hookimpl
def rlcore_register_kl_estimators(register):
    from rlcore.algorithms.kl import KL_ESTIMATORS

    for name, estimator in KL_ESTIMATORS.items():
        register(name, estimator)
