"""Every leaf key (except Hydra's ``_target_``) of the union of verl's four generated trainer configs
(``verl/trainer/config/_generated_*.yaml``: ppo_trainer, ppo_megatron_trainer, ppo_torchtitan_trainer,
ppo_veomni_trainer) at verl-project/verl commit 1dda039, with verl's default value, written as an
override. None is accepted without an effect: each is mapped onto an rlcore setting, implemented,
ignored with a warning naming its category, or refused with what to use instead.
"""

from __future__ import annotations

import collections
from pathlib import Path

import attrs
import pytest

from rlcore.config import load_job
from rlcore.config.overrides import _field_type, parse_override, translate_verl, verl_disposition
from rlcore.config.verl_keys import CATEGORIES
from rlcore.errors import ConfigError
from rlcore.plugins.manager import PluginManager

VERL_REFERENCE_COMMIT = "1dda039"

# How many of the keys fall in each disposition; ignored ones by category.
EXPECTED_COUNTS = {
    # + Ulysses 6, torch.compile 2, megatron optimizer offload 2, fsdp_size 3, SAPO 2, chat template 1, adapter 2,
    # distillation 12, VeOmni and FSDP-Turbo on the fsdp backend 18, optim.min_lr 2, LoRA exclude_modules 2,
    # megatron param and grad offload 5, the rollout engine's data and expert parallelism and quantization 3,
    # the policy's model.override_config 1, calculate_sum_pi_squared 1, megatron expert (tensor) parallel sizes 6,
    # distillation's topk 1 (forward_kl_topk), megatron context parallel size 3, checkpoint.save_contents 2,
    # megatron dist checkpoints as the starting model 9 (use_dist_checkpointing, dist_checkpointing_path and
    # dist_checkpointing_prefix of actor, ref and critic), router replay 7 (the actor's mode in 3 spellings,
    # rollout.enable_rollout_routing_replay, VeOmni's enable_fsdp_offload of actor, ref and critic),
    # data.image_key 1, actor.freeze_vision_tower 1, PF-PPO 3 (algorithm.use_pf_ppo, pf_ppo.reweight_method and
    # pf_ppo.weight_pow), optim.eps and optim.num_cycles of actor and critic 4
    "mapped": 290,
    "implemented": 9,  # algorithm.rollout_correction.* (7), the reward manager's name (2 spellings)
    # refused unless set to what rlcore does anyway (verl's default is always accepted); router replay: the
    # record/replay files (10) and the reference's and critic's modes (5); data.image_key and
    # actor.freeze_vision_tower are now mapped (-2); algorithm.use_pf_ppo is now mapped (-1); optim.eps and
    # optim.num_cycles of actor and critic (-4)
    "refused": 179,
    "ignored/other-engines": 82,  # torchtitan, trtllm
    "ignored/feature-off": 114,  # + the vision patch size (a job whose data carries images is refused); - PF-PPO's 2
    "ignored/machinery": 209,
    "ignored/profiler": 132,
    "ignored/tuning": 163,  # + the expert parallelism of VeOmni and FSDP-Turbo (9): the fsdp backend shards experts
    "ignored/derived": 56,
}

# The keys and verl's defaults, one override a line ("key=default"), as data beside this file.
VERL_KEYS_AND_DEFAULTS = (Path(__file__).parent / "verl_1dda039_keys.txt").read_text()
KEYS = [line.partition("=")[::2] for line in VERL_KEYS_AND_DEFAULTS.splitlines()]
NOT_A_SETTING = "not-a-setting-value"


def _sections() -> dict[str, type]:
    return {e.name: e.value for e in PluginManager().registry("config_sections").entries()}


def _is_setting(key: str, sections: dict[str, type]) -> bool:
    if _field_type(key.split(".")) is not None:
        return True
    for path, cls in sections.items():
        if key.startswith(path + "."):
            name = key[len(path) + 1:].split(".")[0]
            return name in attrs.fields_dict(cls)
    return False


def _verl_default(value: str) -> bool:
    return "${" not in value and value != "???"


def test_the_inventory_is_verls_union_of_1234_leaf_keys():
    assert len(KEYS) == len({key for key, _ in KEYS}) == 1234
    assert not [key for key, _ in KEYS if key.split(".")[-1] == "_target_"]


def test_every_key_has_a_disposition_and_the_counts_are_as_listed():
    counts = collections.Counter()
    for key, _ in KEYS:
        kind, what = verl_disposition(key)
        counts[f"ignored/{what}" if kind == "ignored" else kind] += 1
    assert dict(counts) == EXPECTED_COUNTS
    assert {c.split("/")[1] for c in counts if c.startswith("ignored/")} <= set(CATEGORIES)


def test_every_mapped_key_lands_on_an_rlcore_setting():
    sections = _sections()
    unknown = [(key, target) for key, _ in KEYS for kind, target in [verl_disposition(key)]
               if kind == "mapped" and not _is_setting(target, sections)]
    assert unknown == []


def test_every_ignored_key_warns_once_naming_its_category():
    for key, value in KEYS:
        kind, category = verl_disposition(key)
        if kind != "ignored":
            continue
        given = value if _verl_default(value) else NOT_A_SETTING
        kept, warnings, _, problems = translate_verl([parse_override(f"{key}={given}")])
        assert (kept, problems) == ([], []), key
        assert len(warnings) == 1 and warnings[0].startswith(f"verl key {key} is ignored ({category}: "), key


def test_every_refused_key_accepts_verls_default_and_refuses_another_value_saying_what_to_do():
    for key, value in KEYS:
        kind, instead = verl_disposition(key)
        if kind != "refused":
            continue
        if _verl_default(value):
            kept, warnings, _, problems = translate_verl([parse_override(f"{key}={value}")])
            assert problems == [] and kept == [], key
            assert warnings[0].startswith(f"verl key {key} is ignored (as-rlcore: "), key
        _, _, _, problems = translate_verl([parse_override(f"{key}={NOT_A_SETTING}")])
        assert problems == [f"{key}={NOT_A_SETTING!r} is refused: {instead}"], key


def test_a_refused_value_stops_the_job_naming_the_key():
    with pytest.raises(ConfigError) as info:
        load_job(None, ["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"],
                 manager=PluginManager(), check=False)
    (problem,) = info.value.problems
    assert problem.startswith("actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 is refused: ")
    assert "virtual pipeline stages" in problem
