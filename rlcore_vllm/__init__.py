"""rlcore plugin: the ``vllm`` rollout engine (``rollout.name = "vllm"``) and its ``[rollout.vllm]`` table.

Imports without vLLM: the engine module, and vLLM with it, load only when a job picks the engine.
"""

from rlcore.api import JobCheck, RolloutEngine, VerlKeys, hookimpl
from rlcore_vllm.options import VllmOptions


def vllm_rollout(spec, platform, actor):
    """The registered factory: builds a ``VllmRollout`` (importing vLLM now)."""
    from rlcore_vllm.rollout import VllmRollout

    return VllmRollout(spec, platform, actor)


@hookimpl
def rlcore_register_rollout_engines(register):
    register("vllm", RolloutEngine(
        vllm_rollout,
        requires=("vllm",),  # checked before a job starts (rlcore.runs.preflight) and by `rlcore plugins`
        # async_training.mode = "auto" runs the colocated form on one device with this engine: measured 1.39x
        # lockstep's samples/s there with the fsdp backend (docs/async.md, "One GPU")
        colocated_faster_on_one_device=True,
        # rollout.return_routed_experts: its rows carry the experts vLLM chose (router replay R3)
        returns_routed_experts=True,
        # async_training.partial_rollout: between two engine steps it loads the weights a sync brought
        # (VllmRollout.weights_between_steps), and its running requests compute their cache again under them
        takes_weights_mid_generation=True,
        # rollout.vllm.lora_sync = "adapter": it applies a LoRA actor's adapter itself, each sync moving only the
        # adapter (VllmRollout.applies_adapter, update_adapter), in lockstep and in the asynchronous forms
        applies_lora_adapters=True,
        # prompts with images (a vision-language model's rows): handed to vLLM as multi_modal_data, vLLM's
        # processor putting in each image's tokens (VllmRollout.generate)
        takes_images=True,
        # its engine core runs in the worker's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, rollout.py), so
        # profiler.steps traces its kernels beside the trainer's
        computes_in_worker_process=True))


@hookimpl
def rlcore_register_config_sections(register):
    register("rollout.vllm", VllmOptions)


@hookimpl
def rlcore_register_job_checks(register):
    from rlcore_vllm.options import problems

    register("rollout.vllm", JobCheck(problems=problems))


@hookimpl
def rlcore_register_verl_keys(register):
    # vLLM engine options that verl keeps in its rollout table live in this plugin's [rollout.vllm]
    register("vllm", VerlKeys(aliases=(
        *((f"actor_rollout_ref.rollout.{key}", f"rollout.vllm.{key}") for key in (
            "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enforce_eager", "enable_prefix_caching",
            "load_format", "enable_chunked_prefill", "logprobs_mode", "seed")),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm", "rollout.vllm.engine_kwargs"),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm.", "rollout.vllm.engine_kwargs."),
    )))
