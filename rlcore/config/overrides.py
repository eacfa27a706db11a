"""Command-line overrides (``key.path=value``) and the mapping of verl's keys onto rlcore's.

Values are TOML literals (``1e-6``, ``true``, ``["console","wandb"]``); Python's ``True``/``False``
and ``null``/``None`` are accepted as verl (Hydra) users write them; anything else is a string.
"""

from __future__ import annotations

import sys
import typing
from typing import Any

import attrs

from rlcore.config import verl_keys
from rlcore.config.schema import JobConfig
from rlcore.errors import ConfigError, PluginError
from rlcore.plugins.manager import get_manager
from rlcore.plugins.settings import VerlKeys, VerlTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# verl key (or prefix ending in ".") -> rlcore key (or prefix), for the tables of ``JobConfig`` itself
# (model, actor, ref, critic, trainer); the components' tables (rollout, reward, distillation, ...) and
# the plugins declare those of their own sections beside them (``VerlKeys``). An exact key wins over a prefix, a longer prefix over
# a shorter one. Keys that verl and rlcore spell alike (data.*, trainer.*, algorithm.*,
# critic.optim.*, ...) need no entry.
VERL_KEYS: tuple[tuple[str, str], ...] = (
    # verl's per-role training strategy; rlcore has one trainer.backend for every role
    ("actor_rollout_ref.actor.strategy", "trainer.backend"),
    ("actor_rollout_ref.ref.strategy", "trainer.backend"),
    ("critic.strategy", "trainer.backend"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "actor.policy_loss"),
    ("actor_rollout_ref.actor.loss_mode", "actor.policy_loss"),
    ("actor_rollout_ref.actor.policy_loss.", "actor."),
    ("actor_rollout_ref.actor.grad_clip", "actor.optim.grad_clip"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "actor.optim.warmup_steps_ratio"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "actor.optim.warmup_steps"),
    ("actor_rollout_ref.actor.optim.warmup_style", "actor.optim.lr_scheduler"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor.optim.lr_scheduler"),
    ("actor_rollout_ref.actor.optim.lr_decay_style", "actor.optim.lr_scheduler"),  # verl's other spelling
    ("actor_rollout_ref.actor.optim.clip_grad", "actor.optim.grad_clip"),  # verl's other spelling
    ("actor_rollout_ref.actor.use_remove_padding", "model.use_remove_padding"),
    ("actor_rollout_ref.actor.router_replay.mode", "actor.router_replay"),
    # verl's per-role engine choice; rlcore has one trainer.backend for every role
    ("actor_rollout_ref.actor.model_engine", "trainer.backend"),
    ("actor_rollout_ref.actor.", "actor."),
    ("actor_rollout_ref.ref.", "ref."),
    # today's LoRA keys (verl >= 0.6.1); the older model.lora_rank, ... are rlcore's own names
    ("actor_rollout_ref.model.lora.rank", "model.lora_rank"),
    ("actor_rollout_ref.model.lora.alpha", "model.lora_alpha"),
    ("actor_rollout_ref.model.lora.target_modules", "model.target_modules"),
    ("actor_rollout_ref.model.lora.adapter_path", "model.lora_adapter_path"),
    ("actor_rollout_ref.model.exclude_modules", "model.lora_exclude_modules"),
    ("critic.model.exclude_modules", "critic.model.lora_exclude_modules"),
    ("critic.model.lora.rank", "critic.model.lora_rank"),
    ("critic.model.lora.alpha", "critic.model.lora_alpha"),
    ("critic.model.lora.target_modules", "critic.model.target_modules"),
    ("actor_rollout_ref.model.", "model."),
    ("critic.grad_clip", "critic.optim.grad_clip"),
    ("critic.optim.lr_warmup_steps_ratio", "critic.optim.warmup_steps_ratio"),
    ("critic.optim.lr_warmup_steps", "critic.optim.warmup_steps"),
    ("critic.optim.warmup_style", "critic.optim.lr_scheduler"),
    ("critic.optim.lr_scheduler_type", "critic.optim.lr_scheduler"),
    ("critic.optim.lr_decay_style", "critic.optim.lr_scheduler"),
    ("critic.optim.clip_grad", "critic.optim.grad_clip"),
    ("model_engine", "trainer.backend"),
    # verl keeps actor and critic checkpoints apart; rlcore's checkpoint holds both, kept or pruned together.
    ("trainer.max_actor_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
    ("trainer.max_critic_ckpt_to_keep", "trainer.max_ckpt_to_keep"),
)

# verl's trainer config names (a launch script's --config-name) that imply nothing beyond rlcore's own
# defaults; plugins declare those that choose their settings (``VerlKeys.config_names``)
VERL_CONFIG_NAMES: dict[str, dict[str, str]] = {"ppo_trainer": {}}
# rlcore key -> {verl's value: rlcore's}, for the core's settings whose values verl spells differently
VERL_VALUES: dict[str, dict[Any, Any]] = {"actor.router_replay": {"disabled": "off"}}


@attrs.frozen
class VerlMapping:
    """The core's verl keys and every installed plugin's, merged."""

    aliases: dict[str, str]
    values: dict[str, dict[Any, Any]]
    rules: tuple[verl_keys.Rule, ...] = ()  # the plugins', in the order they were loaded
    config_names: dict[str, dict[str, str]] = attrs.field(factory=dict)
    tables: tuple[VerlTable, ...] = ()

    def table(self, key: str) -> VerlTable | None:
        """The translated table that ``key`` lies under, if any."""
        return next((t for t in self.tables if key.startswith(t.prefix)), None)

    def key(self, key: str) -> str | None:
        """rlcore's key for a verl key, or None when ``key`` is not one verl spells differently: an
        exact entry, else the longest prefix entry that ``key`` starts with."""
        if key in self.aliases and not key.endswith("."):
            return self.aliases[key]
        prefixes = [p for p in self.aliases if p.endswith(".") and key.startswith(p)]
        if not prefixes:
            return None
        longest = max(prefixes, key=len)
        return self.aliases[longest] + key[len(longest):]


def verl_mapping(manager=None) -> VerlMapping:
    """The core's ``VERL_KEYS`` plus the ``VerlKeys`` each plugin of ``manager`` (default: the
    process's) registered. A verl key or value claimed twice is an error naming both claimants."""
    manager = manager or get_manager()
    aliases: dict[str, str] = {}
    values: dict[str, dict[Any, Any]] = {}
    owner: dict[str, str] = {}

    def claim(what: str, by: str) -> None:
        if what in owner:
            raise PluginError(f"{what} is mapped twice: by {owner[what]} and by {by}")
        owner[what] = by

    entries = manager.registry("verl_keys").entries()
    for entry in entries:
        if not isinstance(entry.value, VerlKeys):
            raise PluginError(f"verl_keys {entry.name!r} registered by {entry.provider} is a "
                              f"{type(entry.value).__name__}; expected an rlcore.api.VerlKeys")
    declared = [("the core", VERL_KEYS, VERL_VALUES, VERL_CONFIG_NAMES)] + [
        (str(e.provider), e.value.aliases, e.value.values, e.value.config_names) for e in entries]
    rules = tuple(rule for entry in entries for rule in entry.value.rules)
    tables = tuple(table for entry in entries for table in entry.value.tables)
    for table in tables:
        claim(f"verl table {table.prefix!r}", next(str(e.provider) for e in entries if table in e.value.tables))
    config_names: dict[str, dict[str, str]] = {}
    for by, pairs, value_maps, names in declared:
        for verl, ours in pairs:
            claim(f"verl key {verl!r}", by)
            aliases[verl] = ours
        for ours, spelled in value_maps.items():
            for verl_value, value in spelled.items():
                claim(f"verl value {verl_value!r} of {ours}", by)
                values.setdefault(ours, {})[verl_value] = value
        for name, settings in names.items():
            claim(f"verl config name {name!r}", by)
            config_names[name] = dict(settings)
    return VerlMapping(aliases, values, rules, config_names, tables)



@attrs.frozen
class Override:
    text: str  # as given on the command line
    key: str  # the rlcore key it sets
    value: Any
    verl_key: str | None = None  # the verl key it was given as, if it was mapped


def map_verl_key(key: str, mapping: VerlMapping | None = None) -> str | None:
    """rlcore's key for a verl key, or None when ``key`` is not one verl spells differently."""
    return (mapping or verl_mapping()).key(key)


def parse_value(raw: str) -> Any:
    raw = raw.strip()
    if raw in ("True", "False"):
        return raw == "True"
    if raw in ("null", "None", "~"):
        return None
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if raw.startswith("[") and raw.endswith("]") and "[" not in raw[1:-1]:
        # Hydra's list of bare words, as verl command lines write them: [q_proj,v_proj]
        return [parse_value(item) for item in raw[1:-1].split(",") if item.strip()]
    return raw


def _field_type(path: list[str]) -> Any:
    """The annotated type of a dotted JobConfig path, or None if it is not a field."""
    cls: Any = JobConfig
    tp: Any = None
    for part in path:
        if not attrs.has(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        tp = hints[part]
        cls = tp
    return tp


def _wants_string(tp: Any) -> bool:
    if tp is str:
        return True
    args = typing.get_args(tp)
    return str in args


def parse_override(text: str, mapping: VerlMapping | None = None) -> Override:
    """One ``key=value`` override, a verl key mapped through ``mapping`` (default: the installed
    plugins' and the core's)."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("+")  # Hydra's "+key=value" adds a key; here every key may be set
    if not sep or not key:
        raise ConfigError([f"override {text!r}: expected key.path=value"])
    if "" in key.split("."):  # "actor..clip_ratio" would otherwise read as an unknown [actor] table
        raise ConfigError([f"override {text!r}: malformed key {key!r} (an empty name between dots)"])
    mapping = mapping or verl_mapping()
    ours = mapping.key(key)
    value = parse_value(raw)
    target = ours or key
    if ours and isinstance(value, (str, list)):  # a list is looked up as a tuple: verl's [full]
        value = mapping.values.get(target, {}).get(tuple(value) if isinstance(value, list) else value, value)
    if not isinstance(value, (str, list, dict)) and value is not None and _wants_string(
        _field_type(target.split("."))
    ):
        value = raw.strip()  # e.g. trainer.experiment_name=2024 is a name, not a number
    return Override(text=text, key=target, value=value, verl_key=key if ours else None)


def verl_disposition(key: str, mapping: VerlMapping | None = None) -> tuple[str, str]:
    """What rlcore does with a verl key: ("mapped", rlcore key), ("implemented", how),
    ("ignored", category) or ("refused", what to use instead; some values are accepted)."""
    mapping = mapping or verl_mapping()
    table = mapping.table(key)
    if table is not None:
        return "implemented", table.how
    if key in verl_keys.REWARD_MANAGER_KEYS:
        return "implemented", "naive, dapo, prime and gdpo are rlcore's per-sample reward; batch sets " \
                              "reward.custom_reward_function.batch"
    rule = verl_keys.rule_for(key, mapping.rules)
    if isinstance(rule, verl_keys.Ignore):
        return "ignored", rule.category
    if isinstance(rule, verl_keys.Refuse):
        return "refused", rule.instead
    return "mapped", map_verl_key(key, mapping) or key


def _ignored(key: str, category: str, why: str) -> str:
    return f"verl key {key} is ignored ({category}: {verl_keys.CATEGORIES[category]}): {why}"


def translate_verl(parsed: list[Override], mapping: VerlMapping | None = None
                   ) -> tuple[list[Override], list[str], list[str], list[str]]:
    """(overrides to apply, warnings, notes, problems) after verl's ignored, refused and translated
    keys (``rlcore.config.verl_keys`` and the plugins' rules in ``mapping``) are taken out."""
    mapping = mapping or verl_mapping()
    kept, warnings, notes, problems = [], [], [], []
    by_table: dict[VerlTable, dict[str, Any]] = {}
    for override in _one_named_teacher(parsed, mapping, notes):
        given = override.verl_key or override.key
        table = mapping.table(given)
        if table is not None:
            by_table.setdefault(table, {})[given[len(table.prefix):]] = override.value
            continue
        if given in verl_keys.REWARD_MANAGER_KEYS:
            name = override.value
            if name in verl_keys.REWARD_MANAGERS:
                warnings.append(_ignored(given, "as-rlcore", f"{name}: {verl_keys.REWARD_MANAGERS[name]}"))
            elif name == verl_keys.BATCH_REWARD_MANAGER:  # compute_score takes lists: rlcore's batch setting
                kept.append(Override(text=override.text, key="reward.custom_reward_function.batch", value=True,
                                     verl_key=given))
            else:
                problems.append(f"{given}: unknown reward manager {name!r}; rlcore does naive, dapo, prime, gdpo "
                                "and batch (register other rewards through a plugin)")
            continue
        if override.verl_key is None and _field_type(given.split(".")) is not None:
            # rlcore's own setting by its own name: verl's rules are for verl's keys (the rule for verl's
            # "*.use_torch_compile" once dropped actor.use_torch_compile=true given on the command line)
            kept.append(override)
            continue
        rule = verl_keys.rule_for(given, mapping.rules)
        if isinstance(rule, verl_keys.Ignore):
            warnings.append(_ignored(given, rule.category, rule.why))
        elif isinstance(rule, verl_keys.Refuse):
            if any(_same_value(override.value, allowed) for allowed in rule.unless):
                if rule.mapped:
                    kept.append(override)
                else:
                    warnings.append(_ignored(given, "as-rlcore", f"{override.value!r}"))
            else:
                problems.append(f"{given}={override.value!r} is refused: {rule.instead}")
        else:
            kept.append(override)
            if given in verl_keys.RENAMED:
                notes.append(f"{given} is verl's older name; today's is {verl_keys.RENAMED[given]}")
    kept = [_without_built_in_loggers(o, warnings) for o in kept]
    kept += _sequence_aggregation(kept, notes)
    for table, given_keys in by_table.items():
        try:
            ours = table.translate(given_keys)
        except ValueError as exc:
            problems.append(str(exc))
        else:
            kept += [Override(text=f"{table.prefix}*", key=key, value=value, verl_key=f"{table.prefix}*")
                     for key, value in ours.items()]
    return kept, warnings, notes, problems


def _same_value(value: Any, allowed: Any) -> bool:
    """Whether a refused key's value is one rlcore accepts: equal and of the same type (an int for a
    float), a list in any order (verl's save_contents lists are sets)."""
    if isinstance(value, list) and isinstance(allowed, list):
        return sorted(map(str, value)) == sorted(map(str, allowed))
    if isinstance(allowed, float) and isinstance(value, int) and not isinstance(value, bool):
        return value == allowed
    return value == allowed and type(value) is type(allowed)


def _one_named_teacher(parsed: list[Override], mapping: VerlMapping, notes: list[str]) -> list[Override]:
    """verl's teachers given under names of their own (``+distillation.teacher_models.gsm8k.*``, which
    replace the default ``teacher_model``). One is read as ``teacher_model``, its ``key`` (the data source
    it serves) dropped: rlcore's one teacher scores every sample. Several become ``distillation.teachers``,
    {key: model_path}; their other keys (inference servers, replicas) go on to the rules as they are."""
    prefix = verl_keys.TEACHER_MODELS
    given = [(o, (o.verl_key or o.key)[len(prefix):].partition(".")) for o in parsed
             if (o.verl_key or o.key).startswith(prefix)]
    names = {name for _, (name, _, _) in given} - {verl_keys.DEFAULT_TEACHER}
    if len(names) > 1:
        return _several_teachers(parsed, sorted(names), notes)
    if len(names) != 1:
        return parsed
    (name,) = names
    renamed = []
    for override in parsed:
        key = override.verl_key or override.key
        if not key.startswith(f"{prefix}{name}."):
            renamed.append(override)
        elif key == f"{prefix}{name}.key":
            notes.append(f"{key}={override.value!r}: rlcore's one teacher scores every sample (verl gives it the "
                         "samples of that data source)")
        else:
            rest = key[len(f"{prefix}{name}."):]
            _, _, raw = override.text.partition("=")
            renamed.append(parse_override(f"{prefix}{verl_keys.DEFAULT_TEACHER}.{rest}={raw}", mapping))
            if rest == "model_path":
                notes.append(f"{key} is verl's one teacher under the name {name!r}: distillation.teacher_path")
    return renamed


def _several_teachers(parsed: list[Override], names: list[str], notes: list[str]) -> list[Override]:
    """verl's named teachers -> one ``distillation.teachers`` override, {data source: model path}; a
    teacher without its key or model path stays as it is, and is refused by the rules."""
    prefix = verl_keys.TEACHER_MODELS
    fields: dict[str, dict[str, Override]] = {name: {} for name in names}
    for override in parsed:
        name, _, rest = (override.verl_key or override.key)[len(prefix):].partition(".")
        if (override.verl_key or override.key).startswith(prefix) and name in fields and rest in ("key", "model_path"):
            fields[name][rest] = override
    complete = {name: given for name, given in fields.items() if set(given) == {"key", "model_path"}}
    consumed = {id(o) for given in complete.values() for o in given.values()}
    teachers = {str(given["key"].value): str(given["model_path"].value) for given in complete.values()}
    if len(teachers) < len(complete):
        return parsed  # two teachers for one data source: left to the rules, which refuse them
    kept = [o for o in parsed if id(o) not in consumed]
    if teachers:
        notes.append("verl's teachers " + ", ".join(f"{name!r} ({given['key'].value})" for name, given in
                                                    complete.items()) + ": distillation.teachers, each scoring the "
                     "samples of its data_source")
        # given as rlcore's own key: the rules are for verl's keys
        kept.append(Override(text=f"{prefix}*.key/model_path", key="distillation.teachers", value=teachers))
    return kept


def _without_built_in_loggers(override: Override, warnings: list[str]) -> Override:
    """``trainer.logger`` without the verl logger names rlcore covers in every run (``file``)."""
    if override.key != "trainer.logger" or not isinstance(override.value, list):
        return override
    dropped = [name for name in override.value if name in verl_keys.BUILT_IN_LOGGERS]
    for name in dropped:
        warnings.append(_ignored(f"trainer.logger {name!r}", "as-rlcore", verl_keys.BUILT_IN_LOGGERS[name]))
    return attrs.evolve(override, value=[name for name in override.value if name not in dropped]) if dropped \
        else override


def _sequence_aggregation(kept: list[Override], notes: list[str]) -> list[Override]:
    """verl aggregates some policy losses per sequence whatever its loss_agg_mode: given one of them
    as a verl key and no loss_agg_mode, say so in rlcore's setting."""
    loss = next((o for o in kept if o.key == "actor.policy_loss" and o.verl_key), None)
    if loss is None or loss.value not in verl_keys.SEQUENCE_AGGREGATED_LOSSES or any(
            o.key == "actor.loss_agg_mode" for o in kept):
        return []
    notes.append(f"verl aggregates the {loss.value} policy loss per sequence: actor.loss_agg_mode = "
                 "'seq-mean-token-mean' (its entropy and KL terms too)")
    return [Override(text=loss.text, key="actor.loss_agg_mode", value="seq-mean-token-mean", verl_key=loss.verl_key)]


def conflicting_verl_keys(parsed: list[Override]) -> list[str]:
    """Problems where two different verl keys land on one rlcore key with different values (say
    ``trainer.max_actor_ckpt_to_keep`` and ``max_critic_ckpt_to_keep``: rlcore has one setting)."""
    first: dict[str, Override] = {}
    problems = []
    for override in parsed:
        if override.verl_key is None:
            continue
        earlier = first.setdefault(override.key, override)
        if earlier.verl_key != override.verl_key and earlier.value != override.value:
            problems.append(f"{override.key}: {earlier.text!r} and {override.text!r} both set it (rlcore has one "
                            "setting for the two verl keys), to different values: give one value")
    return problems


def apply_overrides(raw: dict, overrides: list[Override]) -> list[str]:
    """Set each override in the raw TOML data; returns problems for keys that cannot be set."""
    problems = []
    for override in overrides:
        parts = override.key.split(".")
        node = raw
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                problems.append(f"{override.key}: cannot set it, {where} is a value, not a table")
                break
            node = child
        else:
            if override.value is None:
                node.pop(parts[-1], None)
            else:
                node[parts[-1]] = override.value
    return problems
