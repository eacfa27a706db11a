"""What this backend does with verl's FSDP keys (``*.fsdp_config.*``, ``*.fsdp.*``) and those of verl's
FSDP2-based engines, VeOmni (``*.veomni.*``) and FSDP-Turbo (``*.turbo_config.*``), which it stands in
for: the settings it takes land on its own tables, the others are ignored or refused with the reason."""

from rlcore.api import VerlIgnore, VerlKeys, VerlRefuse

# verl's VeOmni and FSDP-Turbo place each expert on some ranks and send tokens to it; this backend shards
# a Hugging Face mixture of experts like any model (tests/fsdp/test_moe.py)
EXPERTS_SHARDED = ("the fsdp backend runs the Hugging Face model's own mixture-of-experts layers with every weight, "
                   "experts included, sharded over the FSDP ranks (actor.fsdp.fsdp_size) and gathered layer by "
                   "layer, instead of placing each expert on its own ranks and sending tokens to them: the same "
                   "log-probs and updates, with more memory and communication per layer (experts split over "
                   "ranks: trainer.backend=megatron with actor.megatron.expert_model_parallel_size)")
# (verl's role prefix, this backend's role prefix) for the engine tables below
_ROLES = (("actor_rollout_ref.actor", "actor"), ("actor_rollout_ref.ref", "ref"), ("critic", "critic"))
_TURBO = ("fsdp_config.turbo_config", "fsdp.turbo_config")  # FSDP-Turbo's table, under the role's FSDP table
# VeOmni's and FSDP-Turbo's settings that this backend has: (verl name, this backend's key under the role)
_VEOMNI = (("param_offload", "fsdp.param_offload"), ("optimizer_offload", "fsdp.optimizer_offload"),
           ("fsdp_size", "fsdp.fsdp_size"), ("ulysses_parallel_size", "ulysses_sequence_parallel_size"))
_TURBO_SETTINGS = (("distributed.fully_shard_parallel_size", "fsdp.fsdp_size"),
                   ("distributed.ulysses_parallel_size", "ulysses_sequence_parallel_size"))
_ENGINE_ALIASES = (
    *((f"{verl}.veomni.{name}", f"{ours}.{target}") for verl, ours in _ROLES for name, target in _VEOMNI
      if not (ours == "ref" and name == "optimizer_offload")),
    ("actor_rollout_ref.actor.veomni.use_torch_compile", "actor.use_torch_compile"),
    # VeOmni's router replay is the actor's (rlcore.models.routing hooks on the Hugging Face routers)
    ("actor_rollout_ref.actor.veomni.router_replay.mode", "actor.router_replay"),
    # VeOmni's enable_fsdp_offload hands FSDP2 a CPUOffloadPolicy, which is what fsdp.param_offload does
    *((f"{verl}.veomni.enable_fsdp_offload", f"{ours}.fsdp.param_offload") for verl, ours in _ROLES),
    *((f"{verl}.{table}.{name}", f"{ours}.{target}") for verl, ours in _ROLES[:2] for table in _TURBO
      for name, target in _TURBO_SETTINGS),
    *((f"critic.{table}.{name}", f"critic.{target}")
      for table in ("fsdp.turbo_config", "model.fsdp_config.turbo_config") for name, target in _TURBO_SETTINGS),
)


def _veomni(*names: str) -> tuple[str, ...]:
    """verl's keys of VeOmni's tables (``actor_rollout_ref.<role>.veomni.<name>``, ``critic.veomni.<name>``):
    spelled in full, so that rlcore's own ``[actor.veomni]`` and ``[ref.veomni]`` (the veomni backend's
    tables, rlcore_veomni) are never taken for them."""
    return tuple(f"{prefix}.veomni.{name}" for name in names for prefix in ("actor_rollout_ref.*", "critic"))


_FROZEN = VerlIgnore("machinery", "the reference is frozen: it has no optimizer and no backward pass")
_ENGINE_RULES = (
    (("actor_rollout_ref.ref.veomni.optimizer_offload",), _FROZEN),
    (("*.turbo_config.distributed.fully_shard_parallel_size",
      "*.turbo_config.distributed.ulysses_parallel_size", "actor_rollout_ref.actor.veomni.use_torch_compile",
      "actor_rollout_ref.actor.veomni.router_replay.mode", *_veomni("enable_fsdp_offload"),
      *_veomni(*(name for name, _ in _VEOMNI))), None),  # mapped by the aliases above
    ((*_veomni("expert_parallel_size"), "*.turbo_config.distributed.expert_*"),
     VerlIgnore("tuning", EXPERTS_SHARDED)),
    (("*.turbo_config.distributed.tensor_parallel_size",),
     VerlRefuse("the fsdp backend shards a model, it does not split its layers: tensor parallelism is "
                "trainer.backend=megatron (actor.megatron.tensor_model_parallel_size)", (1,))),
    ((*_veomni("enable_full_shard"),),
     VerlRefuse("the fsdp backend shards parameters, gradients and optimizer states over actor.fsdp.fsdp_size "
                "ranks (FSDP2's full shard)", (True,))),
    ((*_veomni("load_checkpoint_path"),), VerlRefuse("resume with trainer.resume_mode", (None,))),
    ((*_veomni("mixed_precision", "seed", "strategy"), "*.turbo_config.distributed.fsdp_plan.*_dtype"),
     VerlIgnore("derived", "the fsdp backend computes in model.dtype, reduces gradients in fp32 and seeds from "
                           "trainer.seed")),
    (_veomni("init_device", "ckpt_manager", "force_use_huggingface"),
     VerlIgnore("machinery", "the fsdp backend loads the Hugging Face model and writes its own checkpoints")),
    (("actor_rollout_ref.ref.fsdp_config.turbo_config.memory.*", "actor_rollout_ref.ref.veomni.enable_reentrant"),
     _FROZEN),
    ((*_veomni("*_implementation", "basic_modules", "activation_gpu_limit", "enable_reentrant"), "*.turbo_config.*"),
     VerlIgnore("tuning", "VeOmni's and FSDP-Turbo's kernel choices, module patches and sharding plans; the fsdp "
                          "backend runs the model's own code (model.enable_gradient_checkpointing recomputes)")),
)

VERL_KEYS = VerlKeys(
    # Ulysses sequence parallelism (rlcore_fsdp.ulysses) and torch.compile: verl also spells them in
    # fsdp_config; they are the roles' own settings
    aliases=(("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
              "actor.ulysses_sequence_parallel_size"),
             ("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size", "ref.ulysses_sequence_parallel_size"),
             ("critic.fsdp.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
             ("critic.model.fsdp_config.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
             ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "actor.use_torch_compile"),
             *_ENGINE_ALIASES,
             ("actor_rollout_ref.actor.fsdp_config.", "actor.fsdp."),
             ("actor_rollout_ref.ref.fsdp_config.", "ref.fsdp."),
             ("critic.model.fsdp_config.", "critic.fsdp.")),
    # verl's FSDP2 strategy is this backend; so are its FSDP2-based engines, VeOmni and FSDP-Turbo, whose
    # own settings map below (their kernel choices and module patches do not change what is computed)
    values={"trainer.backend": {"fsdp2": "fsdp", "veomni": "fsdp", "fsdp_turbo": "fsdp"}},
    rules=(
        *_ENGINE_RULES,
        (("*.fsdp_config.mixed_precision.*", "*.fsdp.mixed_precision.*"),
         VerlIgnore("derived", "the fsdp backend computes in model.dtype and reduces gradients in fp32")),
        (("*.fsdp_config.seed", "*.fsdp.seed", "*.fsdp_config.dtype", "*.fsdp.dtype", "*.fsdp_config.model_dtype",
          "*.fsdp.model_dtype", "*.fsdp_config.strategy", "*.fsdp.strategy"),
         VerlIgnore("derived", "from model.* (the critic reads the actor's tokens), trainer.seed, rollout.n, "
                               "data.max_*_length, actor.shuffle, the backend or the estimator")),
        (("actor_rollout_ref.actor.fsdp_config.use_torch_compile",), None),  # mapped by the aliases above
        (("actor_rollout_ref.ref.fsdp_config.use_torch_compile",),
         VerlIgnore("derived", "the reference's layers are compiled when actor.use_torch_compile is set")),
        (("critic.fsdp.use_torch_compile", "critic.model.fsdp_config.use_torch_compile"),
         VerlIgnore("tuning", "rlcore compiles the actor's and reference's layers only (actor.use_torch_compile)")),
    ),
)
