"""What a colocated device holds beside the trainer when the job leaves it unset: from the actor's size,
two engines at all the compute units and the trainer at half for a small model (generation is the longer
phase), one engine and the trainer both at all the units, the trainer's kernels first, from 0.7 B parameters
(training is); a key the job sets is kept; elsewhere one engine, as before."""

from __future__ import annotations

import pytest

from rlcore.asynchronous.arrangement import arranged, choose_arrangement
from rlcore.config import load_job
from rlcore.runtime.platforms import CpuPlatform, CudaPlatform
from rlcore_rocm.platform import RocmPlatform

COLOCATED = ['async_training.mode="colocated"']
# the arrangements by size apply where CUDA MPS may start: its control program on PATH
pytestmark = pytest.mark.usefixtures("mps_control_on_path")


def colocated_job(model: str, *overrides: str):
    return load_job(None, [*COLOCATED, f'model.path="{model}"', *overrides])


@pytest.mark.parametrize("parameters, expected", [
    (135_000_000, (2, 0.5, 1.0, "equal")),      # SmolLM2-135M: generation-bound
    (699_000_000, (2, 0.5, 1.0, "equal")),
    (700_000_000, (1, 1.0, 1.0, "trainer")),
    (1_386_000_000, (1, 1.0, 1.0, "trainer")),  # the Qwen2.5-1.5B shape: training-bound
])
def test_the_actors_size_chooses_the_engines_the_shares_and_the_priority(sized_model, parameters, expected):
    job, arrangement = arranged(colocated_job(sized_model(parameters)), CudaPlatform())
    section = job.config.section("async_training")
    assert (section.engines_per_device, section.trainer_compute_share, section.engine_compute_share,
            section.kernel_priority) == expected
    assert arrangement.line.startswith(f"colocated arrangement: async_training.engines_per_device = {expected[0]}, "
                                       f"trainer_compute_share = {expected[1]:g}, engine_compute_share = "
                                       f"{expected[2]:g}, kernel_priority = {expected[3]!r}: an actor of "
                                       f"{parameters / 1e9:.2f} B parameters")


def test_keys_the_job_sets_are_kept_and_named(sized_model):
    job, arrangement = arranged(colocated_job(sized_model(1_386_000_000), "async_training.engine_compute_share=0.25"),
                                CudaPlatform())
    section = job.config.section("async_training")
    assert (section.engines_per_device, section.trainer_compute_share, section.engine_compute_share,
            section.kernel_priority) == (1, 1.0, 0.25, "trainer")
    assert arrangement.reason.endswith("(engine_compute_share = 0.25 as the job sets)")
    _, arrangement = arranged(colocated_job(sized_model(1_386_000_000), 'async_training.kernel_priority="equal"'),
                              CudaPlatform())
    assert arrangement.kernel_priority == "equal"
    assert arrangement.reason.endswith("(kernel_priority = 'equal' as the job sets)")
    every = colocated_job(sized_model(10), "async_training.engines_per_device=1",
                          "async_training.trainer_compute_share=1.0", "async_training.engine_compute_share=1.0",
                          'async_training.kernel_priority="equal"')
    assert arranged(every, CudaPlatform()) == (every, None)  # nothing left to choose


def test_taking_turns_an_unmeasured_platform_several_devices_or_an_unknown_size_keep_one_engine(sized_model, tmp_path):
    small = sized_model(135_000_000)
    for job, platform in ((colocated_job(small, 'async_training.device_sharing="time_slicing"'), CudaPlatform()),
                          (colocated_job(small), RocmPlatform()), (colocated_job(small), CpuPlatform())):
        arrangement = choose_arrangement(job.config, platform)
        assert (arrangement.engines_per_device, arrangement.trainer_compute_share,
                arrangement.engine_compute_share, arrangement.kernel_priority) == (1, 0.5, 1.0, "equal")
        assert "measured with concurrent sharing on NVIDIA GPUs" in arrangement.reason
    for devices in (["trainer.n_gpus_per_node=2"], ["trainer.nnodes=2"]):
        arrangement = choose_arrangement(colocated_job(small, *devices).config, CudaPlatform())
        assert arrangement.engines_per_device == 1 and "measured on one device" in arrangement.reason
    bin_only = tmp_path / "bin-only"
    bin_only.mkdir()
    (bin_only / "config.json").write_text('{"model_type": "qwen2"}')
    arrangement = choose_arrangement(colocated_job(str(bin_only)).config, CudaPlatform())
    assert arrangement.engines_per_device == 1 and "could not be read from safetensors weights" in arrangement.reason


def test_where_the_mps_control_program_is_missing_auto_sharing_keeps_one_engine(sized_model, tmp_path,
                                                                               monkeypatch):
    """In a container without ``nvidia-cuda-mps-control`` ``device_sharing = "auto"`` takes turns on the device,
    so the arrangement is the one for taking turns, not two engines meant to run beside the trainer's kernels;
    a daemon already joined (CUDA_MPS_PIPE_DIRECTORY) or ``concurrent`` asked for keeps the choice by size
    (the latter then stops at start, saying what is missing)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    small = colocated_job(sized_model(135_000_000))
    arrangement = choose_arrangement(small.config, CudaPlatform())
    assert (arrangement.engines_per_device, arrangement.trainer_compute_share, arrangement.engine_compute_share,
            arrangement.kernel_priority) == (1, 0.5, 1.0, "equal")
    assert arrangement.reason == ("one engine: the processes will take turns on the device, nvidia-cuda-mps-control "
                                  "is not on PATH (it comes with the NVIDIA driver's utilities) "
                                  "(async_training.device_sharing = 'auto')")
    asked = colocated_job(sized_model(135_000_000), 'async_training.device_sharing="concurrent"')
    assert choose_arrangement(asked.config, CudaPlatform()).engines_per_device == 2
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "their-daemon"))
    assert choose_arrangement(small.config, CudaPlatform()).engines_per_device == 2


def test_a_job_on_a_ray_cluster_keeps_one_engine_as_auto_sharing_takes_turns_there(sized_model, monkeypatch):
    """One device, but the job joins a Ray cluster: ``auto`` will take turns (the daemon would serve this machine
    alone), so the arrangement is the one for taking turns, not two engines meant for kernels side by side."""
    small = sized_model(135_000_000)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    arrangement = choose_arrangement(colocated_job(small, 'trainer.ray_address="10.0.0.1:6379"').config, CudaPlatform())
    assert arrangement.engines_per_device == 1
    assert arrangement.reason.startswith("one engine: the processes will take turns on the device, the sharing "
                                         "starts on this machine only, and the job runs on a Ray cluster")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert choose_arrangement(colocated_job(small).config, CudaPlatform()).engines_per_device == 1
    monkeypatch.delenv("RAY_ADDRESS")
    assert choose_arrangement(colocated_job(small).config, CudaPlatform()).engines_per_device == 2


def test_lockstep_split_and_auto_before_it_resolves_are_left_alone(sized_model):
    model = sized_model(10)
    for mode in ("off", "split", "auto"):
        job = load_job(None, [f'async_training.mode="{mode}"', f'model.path="{model}"'])
        assert arranged(job, CudaPlatform()) == (job, None)


def test_a_worker_built_from_an_unarranged_colocated_job_has_one_engine_on_its_device():
    """A rollout worker made outside the controller (tests/vllm/test_async_adapter.py) read None and failed
    comparing it with 1."""
    from rlcore.asynchronous.workers import engines_per_device

    assert engines_per_device(load_job(None, COLOCATED).config) == 1
    assert engines_per_device(load_job(None, [*COLOCATED, "async_training.engines_per_device=2"]).config) == 2
