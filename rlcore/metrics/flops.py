"""Model FLOPs utilisation, verl's ``perf/mfu/*``: the FLOPs a pass needed, over the time it took
times the devices' peak.

The FLOPs come from the model's Hugging Face config, for a dense decoder with a gated MLP (Llama,
Qwen, Mistral, SmolLM families): per token, 2 x the matmul weights (attention projections, MLP,
LM head; the embedding lookup is free), plus 4 x layers x heads x head_dim x the sequence's length
for the attention scores and their use (the full square, as verl counts it, not the causal half).
A training pass is 3 forward passes (backward is twice the forward). Other architectures (mixtures
of experts, non-gated MLPs) get no figure rather than a wrong one.

The peak is ``trainer.peak_tflops_per_device`` when set, otherwise the dense bf16 tensor-core peak
of the device named in ``PEAK_TFLOPS`` (vendor datasheets); a CPU, or an unknown device, has none,
and then no ``perf/mfu/*`` is reported.
"""

from __future__ import annotations

from collections.abc import Sequence

# Dense (no sparsity) bf16 tensor-core peak per device, TFLOPS, matched against the device's name;
# the first match wins, so more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("MI300X", 1307.4),
    ("MI325X", 1307.4),
)

# verl's metric for each timed phase of the actor, and how many forward passes' worth of FLOPs the
# phase costs (per epoch). The critic's (verl's perf/mfu/critic) is not counted yet.
PHASES = {"update_actor": ("perf/mfu/actor", 3.0), "old_log_prob": ("perf/mfu/actor_infer", 1.0)}


def peak_flops(device_name: str, configured_tflops: float | None = None) -> float | None:
    """FLOPs per second of one device: the configured figure, else the table's, else None."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    for name, tflops in PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return tflops * 1e12
    return None


def forward_flops_function(model_config):
    """A function from sequence lengths to the FLOPs of one forward pass over them; None for an
    architecture this module does not count (see the module's docstring)."""
    get = lambda name, default=None: getattr(model_config, name, default)  # noqa: E731
    if get("num_local_experts") or get("num_experts") or get("n_routed_experts"):
        return None  # a mixture of experts: not every weight works on every token
    hidden, layers, heads = get("hidden_size"), get("num_hidden_layers"), get("num_attention_heads")
    intermediate, vocab = get("intermediate_size"), get("vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, heads, intermediate, vocab)):
        return None
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or hidden // heads
    attention_weights = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2  # q, o; k, v
    mlp_weights = 3 * hidden * intermediate  # gate, up, down
    matmul_weights = layers * (attention_weights + mlp_weights) + hidden * vocab

    def flops(lengths: Sequence[int]) -> float:
        tokens = sum(lengths)
        return 2.0 * matmul_weights * tokens + 4.0 * layers * heads * head_dim * sum(n * n for n in lengths)

    return flops


class MfuMeter:
    """``perf/mfu/*`` of a step from its sequence lengths and phase times."""

    def __init__(self, forward_flops, peak: float | None, ppo_epochs: int = 1):
        self.forward_flops, self.peak, self.ppo_epochs = forward_flops, peak, ppo_epochs

    @property
    def active(self) -> bool:
        return self.forward_flops is not None and self.peak is not None

    def metrics(self, lengths: Sequence[int], seconds: dict[str, float], devices: int) -> dict[str, float]:
        if not self.active:
            return {}
        forward = self.forward_flops(lengths)
        out = {}
        for phase, (name, passes) in PHASES.items():
            if seconds.get(phase, 0.0) > 0:
                epochs = self.ppo_epochs if phase != "old_log_prob" else 1
                out[name] = forward * passes * epochs / (seconds[phase] * devices * self.peak)
        return out


def mfu_meter(config, platform) -> MfuMeter:
    """The job's meter: the actor model's config, this machine's first device."""
    from transformers import AutoConfig

    from rlcore.models.loading import resolve_model_path

    try:
        model_config = AutoConfig.from_pretrained(resolve_model_path(config.model.path))
    except (OSError, ValueError):  # not a config transformers reads: no MFU, not a failed job
        model_config = None
    forward = forward_flops_function(model_config) if model_config is not None else None
    name = platform.device_name(0) if platform.device_type != "cpu" else ""
    return MfuMeter(forward, peak_flops(name, config.trainer.peak_tflops_per_device), config.actor.ppo_epochs)
