"""Step metrics under verl's names: timing, scores/rewards/advantages, lengths, throughput."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from rlcore.batch import Batch


class Timer:
    """Collects ``timing_s/<name>`` for one step."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def read_metrics(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """``metrics`` as numbers. The losses give theirs as 0-d tensors on the model's device, so that an update
    sums them over its micro-batches without the host waiting for the device at each one; this reads them
    all in one copy, once a step. Numbers pass through as floats."""
    keys = [key for key, value in metrics.items() if isinstance(value, torch.Tensor)]
    read = {}
    if keys:
        read = dict(zip(keys, torch.stack([metrics[key].detach().float().reshape(()) for key in keys]).tolist()))
    return {key: read[key] if key in read else float(value) for key, value in metrics.items()}


def role_metric_name(role: str, key: str) -> str:
    """A training role's metric, ``<role>/<key>``, unless the key names its own group
    (``rollout_corr/...``, which verl logs as they are from inside the actor's loss in bypass mode)."""
    return key if "/" in key else f"{role}/{key}"


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def data_metrics(batch: Batch, max_response_length: int, max_prompt_length: int) -> dict[str, float]:
    """critic/{score,rewards,advantages,returns,values}/*, response_length/*, prompt_length/*."""
    mask = batch["response_mask"].bool()  # (B, R)
    metrics: dict[str, float] = {}
    metrics |= _stats("critic/score", batch["token_level_scores"].sum(-1))
    metrics |= _stats("critic/rewards", batch["token_level_rewards"].sum(-1))
    for key, name in (("advantages", "advantages"), ("returns", "returns"), ("values", "values")):
        if key in batch:
            metrics |= _stats(f"critic/{name}", batch[key][mask])
    response_length = mask.sum(-1).float()
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    prompt_length = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    metrics |= _stats("prompt_length", prompt_length)
    metrics["prompt_length/clip_ratio"] = (prompt_length >= max_prompt_length).float().mean().item()
    return metrics


def throughput_metrics(batch: Batch, step_seconds: float, workers: int) -> dict[str, float]:
    tokens = int(batch["attention_mask"].sum().item())
    return {"perf/total_num_tokens": tokens, "perf/time_per_step": step_seconds,
            "perf/throughput": tokens / max(step_seconds, 1e-9) / workers}


def _node_memory_used() -> int | None:
    """Bytes of the node's memory in use (MemTotal - MemAvailable); None where /proc/meminfo is absent."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:]}
        return fields["MemTotal"] - fields["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return None


def memory_metrics(platform) -> dict[str, float]:
    """verl's ``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb`` (the device
    allocator's peaks since the worker started; on the CPU platform the process's peak resident
    memory) and ``perf/cpu_memory_used_gb`` (the node's memory in use)."""
    stats = platform.memory_stats()
    metrics = {"perf/max_memory_allocated_gb": stats["peak_allocated"] / 2**30,
               "perf/max_memory_reserved_gb": stats.get("peak_reserved", stats["reserved"]) / 2**30}
    used = _node_memory_used()
    if used is not None:
        metrics["perf/cpu_memory_used_gb"] = used / 2**30
    return metrics


def worst_memory(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """The largest value of each memory metric over the workers."""
    return {k: max(m[k] for m in per_worker if k in m) for k in {k for m in per_worker for k in m}}


# verl's compute_timing_metrics: generation per response token, the passes over whole sequences per token.
_PER_RESPONSE_TOKEN = ("gen",)
_PER_TOKEN = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob")


def timing_metrics(batch: Batch, seconds: dict[str, float]) -> dict[str, float]:
    """``timing_per_token_ms/<phase>`` (phase seconds per token, in ms) and ``timing_share/gen``, the
    share of the step spent generating (the console shows it)."""
    response_tokens = max(int(batch["response_mask"].sum().item()), 1)
    all_tokens = max(int(batch["attention_mask"].sum().item()), 1)
    metrics = {}
    for phase in _PER_RESPONSE_TOKEN + _PER_TOKEN:
        if phase in seconds:
            tokens = response_tokens if phase in _PER_RESPONSE_TOKEN else all_tokens
            metrics[f"timing_per_token_ms/{phase}"] = seconds[phase] * 1000 / tokens
    if seconds.get("step") and "gen" in seconds:
        metrics["timing_share/gen"] = seconds["gen"] / seconds["step"]
    return metrics
