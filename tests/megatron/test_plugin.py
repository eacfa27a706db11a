"""The megatron plugin without megatron-core: it imports, registers the backend and its tables, maps
verl's keys, and asking for a role without megatron-core is one error with the install command."""

from __future__ import annotations

import json
import sys

import pytest

from rlcore.config import load_job
from rlcore.config.verl_script import read_script
from rlcore.errors import ConfigError, RlcoreError
from rlcore.plugins.manager import get_manager
from rlcore.runtime.platforms import CpuPlatform
from rlcore.testing import build_actor, build_critic, build_reference
from rlcore.training.specs import training_spec
from rlcore_megatron.backend import MegatronBackend
from rlcore_megatron.options import MegatronOptions, parallel_sizes
from tests.conftest import run_rlcore
from tests.processes import run_process


def test_the_package_imports_without_megatron_core():
    code = ("import sys; sys.modules['megatron'] = None\n"  # import megatron raises ImportError
            "import rlcore_megatron, rlcore_megatron.actor, rlcore_megatron.critic, rlcore_megatron.checkpoint\n"
            "assert not any(m == 'megatron' or m.startswith('megatron.') for m in sys.modules if sys.modules[m])\n")
    result = run_process([sys.executable, "-c", code], name="import of rlcore_megatron without megatron-core",
                         timeout=120)
    assert result.returncode == 0, result.stderr


def test_rlcore_plugins_lists_the_backend_and_its_tables():
    result = run_rlcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    (plugin,) = [p for p in json.loads(result.stdout)["plugins"] if p["name"] == "megatron"]
    assert plugin["registered"] == {"config_sections": ["actor.megatron", "critic.megatron", "ref.megatron"],
                                    "training_backends": ["megatron"], "verl_keys": ["megatron"]}
    assert isinstance(get_manager().get("training_backends", "megatron"), MegatronBackend)


@pytest.mark.parametrize("role", ["actor", "reference", "critic"])
def test_a_missing_megatron_core_is_one_error_with_the_install_command(monkeypatch, role):
    monkeypatch.setitem(sys.modules, "megatron", None)
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    config = load_job(None, ["model_engine=megatron"], check=False).config
    with pytest.raises(RlcoreError, match=r"needs megatron-core.*pip install rlcore\[megatron\].*Python >= 3\.12"):
        build = {"actor": build_actor, "reference": build_reference, "critic": build_critic}[role]
        build(MegatronBackend(), config, CpuPlatform())


def test_verl_keys_choose_the_backend_and_fill_its_tables():
    config = load_job(None, ["model_engine=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                             "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                             "critic.megatron.use_distributed_optimizer=false"]).config
    assert config.trainer.backend == "megatron"
    assert config.section("actor.megatron") == MegatronOptions(tensor_model_parallel_size=2,
                                                               pipeline_model_parallel_size=2)
    assert config.section("critic.megatron").use_distributed_optimizer is False
    # ref and critic take the actor's layout unless they name one (one Megatron layout per process)
    assert parallel_sizes(config, "ref.megatron") == parallel_sizes(config, "critic.megatron") == (2, 2)
    assert parallel_sizes(load_job(None, []).config, "actor.megatron") == (1, 1)


MOE_SCRIPT = ["model_engine=megatron", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=4",
              "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
              "actor_rollout_ref.ref.megatron.expert_model_parallel_size=4",
              *(f"actor_rollout_ref.actor.megatron.override_transformer_config.{key}" for key in (
                  "moe_router_dtype=fp32", "moe_token_dispatcher_type=flex", "moe_enable_deepep=True",
                  "moe_grouped_gemm=True", "moe_permute_fusion=True", "moe_aux_loss_coeff=0.01",
                  "moe_z_loss_coeff=0.001", "moe_router_load_balancing_type=seq_aux_loss")),
              "critic.megatron.override_transformer_config.moe_router_dtype=fp64"]


# a verl megatron launch script's shape: its mini-batch (2 x 2 samples) splits over megatron's one
# data-parallel group of 8 tensor-parallel ranks, not over fsdp's 8 data-parallel ranks
MEGATRON_SCRIPT = """python3 -m verl.trainer.main_ppo --config-path=config --config-name='{name}.yaml' \\
    data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.rollout.n=2 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8 trainer.n_gpus_per_node=8 {extra}
"""


@pytest.mark.parametrize("name", ["ppo_megatron_trainer", "fully_async_ppo_megatron_trainer",
                                  "one_step_off_ppo_megatron_trainer"])
def test_verls_megatron_trainer_config_names_choose_the_backend(name):
    script = read_script(MEGATRON_SCRIPT.format(name=name, extra=""))
    assert (script.overrides[0], script.ignored) == ("trainer.backend=megatron", [])
    job = load_job(None, script.overrides, check=True)
    assert job.config.trainer.backend == "megatron"
    assert job.config.section("actor.megatron").tensor_model_parallel_size == 8
    with pytest.raises(ConfigError, match=r"\(2 x 2 = 4\) must divide evenly over .* \(8\) workers"):
        load_job(None, script.overrides[1:], check=True)  # the same overrides on the default backend


def test_a_megatron_scripts_explicit_strategy_wins_over_its_config_name():
    explicit = "actor_rollout_ref.actor.strategy=fsdp"
    script = read_script(MEGATRON_SCRIPT.format(name="ppo_megatron_trainer", extra=explicit))
    assert load_job(None, script.overrides, check=False).config.trainer.backend == "fsdp"


def test_verls_moe_keys_reach_the_routers_settings_and_the_reference_routes_as_the_actor():
    import torch

    from rlcore_megatron.config_map import MoeSettings
    from rlcore_megatron.options import expert_parallel_sizes, moe_settings

    job = load_job(None, MOE_SCRIPT)
    config = job.config
    sections = ("actor.megatron", "ref.megatron", "critic.megatron")
    assert [expert_parallel_sizes(config, section) for section in sections] == [(4, 1)] * 3
    gpu = torch.device("cuda")
    actor = MoeSettings(token_dispatcher="alltoall", router_dtype="fp32", load_balancing="seq_aux_loss",
                        aux_loss_coeff=0.01, z_loss_coeff=0.001)  # flex: megatron-core's door to DeepEP
    assert moe_settings(config, "actor.megatron", gpu) == moe_settings(config, "ref.megatron", gpu) == actor
    assert moe_settings(config, "critic.megatron", torch.device("cpu")) == MoeSettings("allgather", router_dtype="fp64")
    ignored = {w.split()[2]: w for w in job.warnings if w.startswith("verl key ")}
    for key in ("moe_enable_deepep", "moe_grouped_gemm", "moe_permute_fusion"):
        assert "(tuning: " in ignored[f"actor_rollout_ref.actor.megatron.override_transformer_config.{key}"]


def test_verls_moe_keys_rlcore_cannot_honour_are_refused_with_the_reason():
    with pytest.raises(ConfigError) as error:
        load_job(None, [f"actor_rollout_ref.actor.megatron.override_transformer_config.{key}" for key in (
            "moe_router_enable_expert_bias=True", "moe_expert_capacity_factor=1.5")])
    message = str(error.value)
    assert "moe_router_enable_expert_bias=True is refused: aux-loss-free balancing (a learned per-expert bias) needs " \
           "a sigmoid router" in message
    assert "moe_expert_capacity_factor=1.5 is refused: of verl's moe_* overrides rlcore takes moe_router_dtype" \
        in message
    assert "pipeline_split" not in message  # counting the embedding or the loss as a layer is taken (test_pipeline_split)


def test_the_tables_are_validated():
    with pytest.raises(ConfigError) as error:
        load_job(None, ["actor.megatron.tensor_model_paralel_size=2", "ref.megatron.pipeline_model_parallel_size=0"])
    message = str(error.value)
    assert 'actor.megatron.tensor_model_paralel_size: unknown key (did you mean "tensor_model_parallel_size"?)' \
        in message
    assert "ref.megatron.pipeline_model_parallel_size: must be >= 1" in message



def _batch_problems(*overrides: str) -> list[str]:
    try:
        load_job(None, list(overrides), check=True)
    except ConfigError as exc:
        return [p for p in exc.problems if "mini-batch" in p or "ppo_mini_batch_size" in p]
    return []


def test_megatron_needs_a_mini_batch_to_divide_over_its_data_parallel_groups_only():
    # verl's DeepSeek-V3 example: TP 8 x PP 12 on 12 x 8 GPUs is one data-parallel group, so 32 x 8 = 256
    # samples a mini-batch are fine there, though not over the 96 workers
    deepseek = ["data.train_batch_size=96", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                "actor_rollout_ref.rollout.n=8", "trainer.n_gpus_per_node=8", "trainer.nnodes=12",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=8"]
    megatron = ["model_engine=megatron", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=12"]
    assert _batch_problems(*deepseek, *megatron) == []
    assert _batch_problems(*deepseek) == ["actor.ppo_mini_batch_size x rollout.n (32 x 8 = 256) must divide evenly "
                                          "over trainer.n_gpus_per_node x trainer.nnodes (96) workers"]
    # TP 2 on 8 workers: 4 groups; 3 x 2 = 6 samples do not divide over them
    assert _batch_problems("data.train_batch_size=6", "actor.ppo_mini_batch_size=3", "rollout.n=2",
                           "trainer.n_gpus_per_node=8", "model_engine=megatron",
                           "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2") == [
        "actor.ppo_mini_batch_size x rollout.n (3 x 2 = 6) must divide evenly over the 4 data-parallel groups of "
        "trainer.n_gpus_per_node x trainer.nnodes (8) workers"]
    # micro-batches are cut from a data-parallel rank's share: 2 x 6 / 4 groups = 3 rows, not a multiple of 2
    assert _batch_problems("data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=6",
                           "trainer.n_gpus_per_node=8", "model_engine=megatron", "actor.ppo_micro_batch_size_per_gpu=2",
                           "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2") == [
        "each data-parallel rank's share of a mini-batch (3 samples = actor.ppo_mini_batch_size x rollout.n / 4 "
        "data-parallel groups) must be a multiple of actor.ppo_micro_batch_size_per_gpu (2)"]


def test_megatron_ranks_fall_into_data_parallel_groups_in_megatrons_rank_order():
    def groups(tp: int, pp: int, workers: int, role: str = "actor", cp: int = 1) -> list[int]:
        config = load_job(None, ["model_engine=megatron", f"actor.megatron.tensor_model_parallel_size={tp}",
                                 f"actor.megatron.pipeline_model_parallel_size={pp}",
                                 f"actor.megatron.context_parallel_size={cp}"], check=False).config
        return MegatronBackend().data_parallel_ranks(training_spec(config, role), workers)

    assert groups(1, 1, 4) == [0, 1, 2, 3]
    assert groups(2, 1, 4) == [0, 0, 1, 1]  # tensor-parallel ranks are neighbours
    assert groups(1, 2, 4) == [0, 1, 0, 1]  # pipeline stages are world / pp ranks apart
    assert groups(2, 2, 8) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert groups(2, 1, 4, role="critic") == [0, 0, 1, 1]  # the critic's sizes default to the actor's
    assert groups(1, 1, 4, cp=2) == [0, 0, 1, 1]  # context-parallel ranks come next to tensor-parallel ones
    assert groups(2, 1, 8, cp=2) == [0, 0, 0, 0, 1, 1, 1, 1]
