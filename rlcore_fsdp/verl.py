"""What this backend does with verl's FSDP keys (``*.fsdp_config.*``, ``*.fsdp.*``): the settings it
takes land on its own tables, the others are ignored or refused with the reason."""

from rlcore.api import VerlIgnore, VerlKeys, VerlRefuse

VERL_KEYS = VerlKeys(
    aliases=(("actor_rollout_ref.actor.fsdp_config.", "actor.fsdp."),
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
        (("*.fsdp_config.fsdp_size", "*.fsdp.fsdp_size"),
         VerlRefuse("rlcore shards over every worker (no hybrid shard)", (-1,))),
    ),
)
