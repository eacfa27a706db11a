"""``[algorithm]``: advantage estimation, the in-reward KL penalty, DAPO's group filter and the rollout
correction (importance weights, rejection, bypass), read by the algorithms beside this file.
``rlcore.config`` assembles it into ``JobConfig``."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.plugins.settings import setting


@attrs.frozen
class KlControl:
    type: str = setting("fixed", choices=("fixed", "adaptive"))
    kl_coef: float = setting(0.001, ge=0.0)
    target_kl: float = setting(0.1, gt=0.0, doc="adaptive: target KL")
    horizon: int = setting(10000, ge=1, doc="adaptive: horizon")


@attrs.frozen
class FilterGroups:
    enable: bool = setting(False, doc="DAPO dynamic sampling: drop groups with equal scores")
    metric: str = setting("acc", doc="per-sample metric compared within a group (acc, score, ...)")
    max_num_gen_batches: int = setting(0, ge=0, doc="0: no limit")


@attrs.frozen
class PfPpo:
    reweight_method: str = setting("pow", choices=("pow", "max_min", "max_random"),
                                   doc="pow: weight |score| ** weight_pow; max_min: only the batch's highest- and "
                                       "lowest-scored samples; max_random: the highest-scored 0.4, the others 0.1")
    weight_pow: float = setting(2.0, ge=0.0, doc="pow: the exponent")


@attrs.frozen
class AlgorithmConfig:
    adv_estimator: str = setting("gae", doc="registered advantage estimator")
    gamma: float = setting(1.0, ge=0.0, le=1.0)
    lam: float = setting(1.0, ge=0.0, le=1.0)
    norm_adv_by_std_in_grpo: bool = setting(True)
    use_kl_in_reward: bool = setting(False)
    kl_penalty: str = setting("kl", doc="KL estimator for the in-reward penalty")
    kl_ctrl: KlControl = setting(factory=KlControl)
    filter_groups: FilterGroups = setting(factory=FilterGroups)
    use_pf_ppo: bool = setting(False, doc="PF-PPO (policy filtration): after GAE, the batch is resampled with "
                                          "replacement, each sample drawn with a weight of its score "
                                          "(algorithm.pf_ppo), so the update sees the reliably scored samples more "
                                          "often; verl's use_pf_ppo, with adv_estimator = 'gae' only")
    pf_ppo: PfPpo = setting(factory=PfPpo)
    rollout_is_threshold: float | None = setting(
        None, gt=0.0, doc="rollout importance sampling: upper bound of the weights pi_train / pi_rollout; "
                          "None: off (no weights, no rollout_corr/ metrics)")
    rollout_is: bool = setting(False, doc="apply the weights (and mask-mode rejection) to the policy loss; "
                                          "false: log the rollout_corr/ metrics only")
    rollout_is_threshold_lower: float | None = setting(None, gt=0.0,
                                                       doc="lower bound (mask mode); None: 1 / rollout_is_threshold")
    rollout_is_level: str = setting("token", choices=("token", "sequence", "geometric"),
                                    doc="a weight per token, per sequence (product), or geometric mean")
    rollout_is_mode: str = setting("truncate", choices=("truncate", "mask"),
                                   doc="truncate: cap the weights (TIS); mask: drop tokens outside the bounds")
    rollout_is_batch_normalize: bool = setting(
        False, doc="divide the weights by their batch mean (over tokens, or over sequences at sequence level) after "
                   "truncation, so they average 1")
    rollout_bypass: bool = setting(
        False, doc="take the rollout engine's log-probs as the old policy's (verl's rollout_correction.bypass_mode): "
                   "no old log-prob pass; the PPO ratio pi_theta / pi_rollout then carries the engine mismatch. With "
                   "rollout_is_threshold, the weights pi_theta / pi_rollout and the rejections are computed in each "
                   "micro-batch, against the policy being trained")
    rollout_bypass_loss: str = setting(
        "ppo_clip", choices=("ppo_clip", "reinforce"),
        doc="with rollout_bypass (verl's rollout_correction.loss_type): ppo_clip: actor.policy_loss on the ratio "
            "pi_theta / pi_rollout, the weights only logged; reinforce: -w * A * log pi_theta, w the (truncated, "
            "detached) weights when rollout_is is true, else 1; rejected tokens leave either loss")
    rollout_rs_level: str | None = setting(
        None, choices=(None, "token", "sequence", "geometric"),
        doc="rejection at a level of its own: drop the tokens (or sequences) whose ratio at this level lies outside "
            "[rollout_rs_threshold_lower, rollout_rs_threshold], whatever the weights' mode; None: only mask mode "
            "rejects (verl's rollout_rs maps onto rollout_rs_criteria)")
    rollout_rs_threshold: float | None = setting(None, gt=0.0, doc="upper bound of rollout_rs_level's ratio")
    rollout_rs_threshold_lower: float | None = setting(None, gt=0.0, doc="lower bound of rollout_rs_level's ratio; "
                                                                         "None: 1 / rollout_rs_threshold")
    rollout_rs_criteria: dict[str, Any] | None = setting(
        None, doc="verl's divergence-based rejection (rollout_rs), criterion -> bound: token_k1, seq_sum_k1, "
                  "seq_mean_k1 -> [lower, upper] of pi_rollout / pi_train (or the upper alone); token_k2/k3, "
                  "seq_sum_k2/k3, seq_mean_k2/k3, seq_max_k2/k3 -> the divergence's upper bound (k1 = -log r, "
                  "k2 = (log r)^2 / 2, k3 = r - 1 - log r, r = pi_train / pi_rollout); a token (or a sequence) any "
                  "criterion rejects leaves the loss, with or without rollout_is")
    rollout_is_veto_threshold: float | None = setting(
        None, gt=0.0, doc="drop a whole sequence with a token ratio below this; None: no veto")
    gdpo_reward_keys: tuple[str, ...] = setting(
        (), doc="adv_estimator gdpo: the keys of the reward function's returned dict that hold its components "
                "(each normalised within its group before they are summed)")
    gdpo_reward_weights: tuple[float, ...] | None = setting(
        None, doc="adv_estimator gdpo: one weight per key of gdpo_reward_keys; None: 1 each")
