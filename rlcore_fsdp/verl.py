"""What this backend does with verl's FSDP keys (``*.fsdp_config.*``, ``*.fsdp.*``): the settings it
takes land on its own tables, the others are ignored or refused with the reason."""

from rlcore.api import VerlIgnore, VerlKeys

VERL_KEYS = VerlKeys(
    # Ulysses sequence parallelism (rlcore_fsdp.ulysses) and torch.compile: verl also spells them in
    # fsdp_config; they are the roles' own settings
    aliases=(("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
              "actor.ulysses_sequence_parallel_size"),
             ("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size", "ref.ulysses_sequence_parallel_size"),
             ("critic.fsdp.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
             ("critic.model.fsdp_config.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
             ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "actor.use_torch_compile"),
             ("actor_rollout_ref.actor.fsdp_config.", "actor.fsdp."),
             ("actor_rollout_ref.ref.fsdp_config.", "ref.fsdp."),
             ("critic.model.fsdp_config.", "critic.fsdp.")),
    values={"trainer.backend": {"fsdp2": "fsdp"}},  # verl's FSDP2 strategy is this backend
    rules=(
        (("*.fsdp_config.turbo_config.*", "*.fsdp.turbo_config.*"),
         VerlIgnore("other-engines", "read only by verl's turbo engine, which this backend is not")),
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
