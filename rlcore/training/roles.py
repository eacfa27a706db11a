"""The roles the controller talks to. Training backends and rollout engines implement them.

Only what the controller calls is here; everything else is the implementation's business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager

import attrs
import torch

from rlcore.batch import Batch


@attrs.frozen
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    do_sample: bool = True
    max_new_tokens: int = 512
    seed: int | None = None  # the controller's seed for this call; engines mix in their group's index


def group_seed(seed: int, group: int) -> int:
    """The sampling seed of generation group ``group`` (ranks that generate together: one per
    data-parallel rank) for a call seeded ``seed``: distinct groups draw distinct samples, and the same
    (seed, group) always draws the same ones, whatever else the job runs."""
    mixed = (seed * 0x9E3779B97F4A7C15 + (group + 1) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    mixed ^= mixed >> 31
    return mixed & (2**62 - 1)


def weight_buckets(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                   ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``weights`` of at most ``bucket_bytes`` (a larger single tensor comes alone),
    taken from ``weights`` only as each bucket is asked for: what ``Actor.weights_for_rollout`` yields."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class Actor(ABC):
    """The policy being trained."""

    @abstractmethod
    def compute_log_prob(self, batch: Batch) -> Batch:
        """``old_log_probs`` (B, R) and ``entropys`` (B, R) of the batch's responses."""

    @abstractmethod
    def update(self, batch: Batch) -> dict[str, float]:
        """One PPO update (epochs x mini-batches) from a batch with advantages; returns metrics."""

    @abstractmethod
    def weights_for_rollout(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full parameters with Hugging Face names, in buckets of at most ``bucket_bytes``."""

    def adapter_for_rollout(self) -> tuple[dict, dict[str, torch.Tensor]] | None:
        """A LoRA actor's adapter for an engine that applies adapters itself (its base weights never
        move): PEFT's ``adapter_config.json`` as a dict and its tensors by PEFT's names, whole on
        every rank (every rank takes part). ``None``: this actor trains no adapters."""
        return None

    @abstractmethod
    def save(self, directory: str) -> None: ...

    @abstractmethod
    def load(self, directory: str) -> None: ...

    def generation_module(self) -> AbstractContextManager[torch.nn.Module]:
        """For an engine colocated in this process (``hf``): a context lending the actor's own
        module, ready for ``generate()`` (eval mode, no gradients, parameters gathered), restored
        afterwards. Backends that cannot lend their module raise ``NotImplementedError``."""
        raise NotImplementedError

    def generation_group(self):
        """The ``torch.distributed`` group of ranks that generate together (a model-parallel group:
        they hold one model between them, so they take one share of the prompts: the union of their
        shares); ``None`` when this rank generates its own share alone."""
        return None

    def set_total_steps(self, total_steps: int) -> None:
        """The job's number of training steps, told before the first update (a learning-rate
        schedule that decays over the run needs it); actors without such a schedule ignore it."""

    def reference_view(self) -> Reference | None:
        """A reference served by this actor's own weights (an actor training LoRA adapters: its
        base model with the adapters off), so the worker keeps no second copy; ``None``: the
        backend builds a reference of its own."""
        return None


class Reference(ABC):
    """A frozen copy of the initial policy."""

    @abstractmethod
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """``ref_log_prob`` (B, R)."""


class Critic(ABC):
    """The value model."""

    @abstractmethod
    def compute_values(self, batch: Batch) -> Batch:
        """``values`` (B, R)."""

    @abstractmethod
    def update(self, batch: Batch) -> dict[str, float]:
        """Clipped value-loss updates from a batch with returns; returns metrics."""

    def set_total_steps(self, total_steps: int) -> None:
        """The job's number of training steps, told before the first update (see ``Actor``)."""

    @abstractmethod
    def save(self, directory: str) -> None: ...

    @abstractmethod
    def load(self, directory: str) -> None: ...


class Rollout(ABC):
    """A generation engine."""

    # True where this engine applies a LoRA actor's adapter itself, as its job asked (only an engine
    # that declares applies_lora_adapters): every sync then hands it ``update_adapter``, never weights
    applies_adapter: bool = False

    @abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """n responses per prompt row (rows repeated n times, in order): ``prompts``, ``responses``,
        ``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids`` and, where the engine
        gives them, ``rollout_log_probs``."""

    def update_weights(self, buckets: Iterator[list[tuple[str, torch.Tensor]]]) -> None:
        """Load new weights; engines that share the actor's module need nothing."""

    def update_adapter(self, adapter_config: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Generate from now on under a LoRA actor's new adapter (PEFT's ``adapter_config.json`` as a
        dict, its tensors by PEFT's names) over ``model.path``'s base weights; engines that set
        ``applies_adapter``."""
        raise NotImplementedError(f"{type(self).__name__} does not apply LoRA adapters itself")

    def release_memory(self) -> None:
        """Free generation memory (KV cache) while training runs."""

    def resume_memory(self) -> None:
        """Take generation memory back before generating."""


class Reward(ABC):
    """What scores a batch of generated responses (``reward.kind``): reward functions by data
    source, a reward model, or a plugin's. The driver places each response's score on its last model
    token (``rlcore.rewards.placement``) and applies the algorithm's shaping (tools' signals,
    overlong)."""

    def check(self, rows: list[dict]) -> None:
        """Before any worker starts: refuse data this reward cannot score (``data_source`` rows)."""

    @abstractmethod
    def score(self, batch: Batch):
        """An ``rlcore.rewards.scorer.RewardResult`` for a generated batch: its ``responses`` and
        ``response_mask`` (token ids) and its prompts' rows (``data_source``, ``ground_truth``,
        ``extra_info``, ``raw_prompt``)."""

    def close(self) -> None:
        """Give back what the reward holds (worker processes)."""
