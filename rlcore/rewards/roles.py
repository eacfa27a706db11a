"""The built-in rewards (``reward.kind``), registered through ``rlcore_register_rewards`` as a
plugin's would be:

- ``function`` (the default): the reward functions registered by data source (and
  ``custom_reward_function``), run by the supervised worker pool (``rlcore.rewards.pool``) on the
  decoded responses;
- ``model``: the reward model (``reward.model.*``) in every hybrid worker, on that worker's share;
  the worker decodes the responses with the policy's tokenizer and applies the reward model's own
  chat template (``rlcore.rewards.model``).
"""

from __future__ import annotations

from collections.abc import Callable

from rlcore.batch import Batch
from rlcore.rewards.scorer import RewardResult, RewardScorer
from rlcore.training.roles import Reward


class FunctionReward(Reward):
    def __init__(self, config, tokenizer, manager, dispatch: Callable[[str, Batch], Batch]):
        self.tokenizer = tokenizer
        self.scorer = RewardScorer(config.reward, manager.registry("reward_functions"))

    def check(self, rows: list[dict]) -> None:
        self.scorer.check_sources(rows)

    def score(self, batch: Batch) -> RewardResult:
        if "response" in batch:  # the text to score, where the rollout gives it (an agent's final answer)
            responses = list(batch["response"])
        else:
            responses = self.tokenizer.batch_decode(
                [ids[mask.bool()] for ids, mask in zip(batch["responses"], batch["response_mask"])],
                skip_special_tokens=True)
        return self.scorer.score(batch["data_source"], responses, batch["ground_truth"], batch["extra_info"])

    def close(self) -> None:
        self.scorer.close()


class ModelReward(Reward):
    def __init__(self, config, tokenizer, manager, dispatch: Callable[[str, Batch], Batch]):
        self.dispatch = dispatch

    def score(self, batch: Batch) -> RewardResult:
        rows = Batch({"responses": batch["responses"], "response_mask": batch["response_mask"]},
                     {"raw_prompt": batch["raw_prompt"]} | ({"response": batch["response"]} if "response" in batch else {}))
        return RewardResult(self.dispatch("compute_rm_score", rows)["rm_scores"], {}, {})


def reward_for(config, tokenizer, manager, dispatch: Callable[[str, Batch], Batch]) -> Reward:
    """The job's reward: ``reward.kind``, else ``model`` with ``reward.model.enable``, else the default."""
    kind = config.reward.kind or ("model" if config.reward.model.enable else None)
    registry = manager.registry("rewards")
    factory = registry.get(kind or registry.default("reward.kind"))
    return factory(config, tokenizer, manager, dispatch)
