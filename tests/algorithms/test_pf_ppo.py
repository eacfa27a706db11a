"""PF-PPO (``algorithm.use_pf_ppo``, ``rlcore.algorithms.pf_ppo``) against verl 0.9.1's own
``compute_pf_ppo_reweight_data``: the same rows drawn from the same seed, for each reweighting method;
and where it applies in a job (after GAE only, as verl) and the warnings where it does not."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rlcore.algorithms.pf_ppo import pf_ppo_sample, pf_ppo_weights
from rlcore.config import load_job
from tests.verl_reference import import_verl


class VerlBatch(dict):
    """What verl's function reads of a DataProto's ``batch``: a dict of tensors with a ``batch_size``."""

    batch_size = None


class VerlData:
    def __init__(self, tensors: dict, rows: dict):
        self.batch, self.non_tensor_batch, self.meta_info = VerlBatch(tensors), rows, {}

    def __deepcopy__(self, memo):
        return VerlData(copy.deepcopy(dict(self.batch), memo), copy.deepcopy(self.non_tensor_batch, memo))


def scores_with_ties(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (24,), generator=generator).float() * 0.5  # ties at the max and min
    scores[3] = 0.0  # a zero score: pow gives it only the floor weight
    return scores


@pytest.mark.parametrize("method, weight_pow", [("pow", 2.0), ("pow", 0.5), ("max_min", 2.0), ("max_random", 2.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_rows_drawn_are_verls_for_the_same_seed(method, weight_pow, seed):
    core_algos = import_verl().core_algos
    scores = scores_with_ties(seed)
    token_scores = torch.zeros(len(scores), 5)
    token_scores[:, -1] = scores  # verl sums token_level_scores over the response
    data = VerlData({"token_level_scores": token_scores, "row": torch.arange(len(scores))},
                    {"uid": np.array([f"u{i}" for i in range(len(scores))], dtype=object)})
    torch.manual_seed(100 + seed)  # verl draws from torch's global generator
    theirs = core_algos.compute_pf_ppo_reweight_data(data, method, weight_pow)
    ours = pf_ppo_sample(token_scores.sum(-1), method, weight_pow, torch.Generator().manual_seed(100 + seed))
    assert ours.tolist() == theirs.batch["row"].tolist()
    assert list(theirs.non_tensor_batch["uid"]) == [f"u{i}" for i in ours.tolist()]


def test_the_weights_of_each_method():
    scores = torch.tensor([1.0, -2.0, 0.0, 1.0, 3.0])
    assert pf_ppo_weights(scores, "pow", 2.0).tolist() == pytest.approx([1.0, 4.0, 1e-8, 1.0, 9.0])
    assert pf_ppo_weights(scores, "max_min", 2.0).tolist() == pytest.approx([1e-8, 1.0, 1e-8, 1e-8, 1.0])
    assert pf_ppo_weights(scores, "max_random", 2.0).tolist() == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.4])
    with pytest.raises(ValueError, match="algorithm.pf_ppo.reweight_method = 'top'"):
        pf_ppo_weights(scores, "top", 2.0)


def test_verls_keys_map_and_a_setting_without_effect_is_warned():
    job = load_job(None, ["algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min",
                          "algorithm.adv_estimator=gae"])
    assert job.config.algorithm.use_pf_ppo and job.config.algorithm.pf_ppo.reweight_method == "max_min"
    assert not [w for w in job.warnings if "pf_ppo" in w]
    grpo = load_job(None, ["algorithm.use_pf_ppo=true", "algorithm.adv_estimator=grpo", "rollout.n=2"])
    assert any(w.startswith("algorithm.use_pf_ppo has no effect: PF-PPO resamples the batch after a critic's "
                            "advantages (adv_estimator = 'gae'), as in verl") for w in grpo.warnings), grpo.warnings
    off = load_job(None, ["algorithm.pf_ppo.weight_pow=3"])
    assert "algorithm.pf_ppo.weight_pow has no effect while algorithm.use_pf_ppo is false" in off.warnings
