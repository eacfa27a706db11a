"""What this backend does with verl's torchtitan engine tables (``actor_rollout_ref.actor.torchtitan.*``,
``actor_rollout_ref.ref.torchtitan.*``, ``critic.torchtitan.*``): ignored with a warning, not yet mapped
onto ``[actor.torchtitan]`` and ``[ref.torchtitan]``. verl's ``model_engine=torchtitan`` needs no rule: it
names this backend."""

from rlcore.api import VerlIgnore, VerlKeys

VERL_KEYS = VerlKeys(rules=(
    (("actor_rollout_ref.*.torchtitan.*", "critic.torchtitan.*"),
     VerlIgnore("other-engines", "verl's torchtitan engine settings are not mapped onto rlcore's torchtitan backend "
                                 "([actor.torchtitan], [ref.torchtitan]; docs/backend-torchtitan.md)")),
))
