"""``async_training.device_sharing``: the colocated trainer and engine take turns on a device, or run their
kernels at once through the platform's sharing (CUDA MPS), started, checked and stopped by the job."""

from __future__ import annotations

import json
import os
import stat
import types

import pytest

from rlcore.asynchronous.arrangement import GENERATION_BOUND, ONE_ENGINE, TRAINING_BOUND, arranged
from rlcore.asynchronous.auto import ModeChoice, colocated_reason
from rlcore.asynchronous.trainer import AsyncTrainer
from rlcore.config import load_job
from rlcore.config.load import read_toml
from rlcore.errors import RlcoreError, SharingUnavailable
from rlcore.metrics.finite import NonFiniteGuard
from rlcore.runtime import cuda_mps
from rlcore.runtime.cuda_mps import SHARES_CHECKED_RIGHT, start_mps
from rlcore.runtime.platforms import CpuPlatform


def settings(*overrides: str):
    return load_job(None, list(overrides)).config.section("async_training")


def test_auto_by_default_and_the_shares_chosen_at_start_among_those_checked_right():
    default = settings()
    assert default.device_sharing == "auto" and default.trainer_compute_share is None
    # the shares the start chooses from the model's size are ones the client check found right (0.8, an
    # old default, computed wrong and was refused: a job asking only for device_sharing = "concurrent"
    # could not start)
    for chosen in (GENERATION_BOUND, TRAINING_BOUND, ONE_ENGINE):
        assert {chosen["trainer_compute_share"], chosen["engine_compute_share"]} <= {*SHARES_CHECKED_RIGHT, 1.0}
    asked = settings("async_training.mode=colocated", "async_training.device_sharing=concurrent",
                     "async_training.trainer_compute_share=0.5")
    assert asked.device_sharing == "concurrent" and asked.trainer_compute_share == 0.5


@pytest.mark.parametrize("overrides, message", [
    (["async_training.mode=split", "async_training.device_sharing=concurrent"],
     "async_training.device_sharing = 'concurrent' is for the colocated form"),
    (["async_training.mode=colocated", "async_training.device_sharing=concurrent", "trainer.nnodes=2"],
     "starts its sharing (CUDA MPS) on this machine only"),
    (["async_training.trainer_compute_share=0"], "async_training.trainer_compute_share: must be > 0.0, got 0.0"),
    (["async_training.trainer_compute_share=1.5"], "async_training.trainer_compute_share: must be <= 1.0, got 1.5"),
    (["async_training.device_sharing=mps"], "expected one of 'auto', 'time_slicing', 'concurrent'"),
    (["async_training.mode=colocated", "async_training.device_sharing=time_slicing",
      "async_training.kernel_priority=trainer"],
     "async_training.kernel_priority = 'trainer' orders the trainer's and the engine's kernels on a device they "
     "share at the same moment, and device_sharing = 'time_slicing' runs one process's kernels at a time"),
    (["async_training.mode=split", "async_training.kernel_priority=engine"],
     "mode = 'split' gives the engines devices of their own; set kernel_priority = 'equal'"),
    (["async_training.kernel_priority=high"], "expected one of 'equal', 'trainer', 'engine'"),
])
def test_sharing_that_cannot_work_is_refused_naming_the_key(overrides, message):
    with pytest.raises(RlcoreError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_job(None, overrides)


def test_a_platform_without_sharing_says_so():
    with pytest.raises(SharingUnavailable, match="the cpu platform has no way to run two processes' kernels"):
        CpuPlatform().start_device_sharing((0.8, 1.0))


def _trainer_asking(sharing: str, platform, lines: list[str], nnodes: int = 1, engine_share: float = 1.0,
                    priority: str = "equal"):
    """An AsyncTrainer's settings, platform and echo, without workers (only the start of sharing runs)."""
    settings = types.SimpleNamespace(device_sharing=sharing, trainer_compute_share=0.75,
                                     engine_compute_share=engine_share, kernel_priority=priority)
    config = types.SimpleNamespace(trainer=types.SimpleNamespace(nnodes=nnodes, ray_address=None))
    trainer = types.SimpleNamespace(settings=settings, platform=platform, echo=lines.append, config=config,
                                    nonfinite=NonFiniteGuard(0), arrangement=None)  # the job set every key
    trainer._arrange_for_turns = types.MethodType(AsyncTrainer._arrange_for_turns, trainer)
    return trainer


def test_time_slicing_starts_nothing_and_says_so():
    lines: list[str] = []
    assert AsyncTrainer._start_device_sharing(_trainer_asking("time_slicing", CpuPlatform(), lines)) is None
    assert lines == ["device sharing: time slicing, the trainer and the engine take turns on each device "
                     "(async_training.device_sharing)"]


def test_concurrent_where_the_platform_cannot_is_an_error_naming_the_key_and_the_way_out(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(RlcoreError, match="async_training.device_sharing = 'concurrent': the cpu platform has no way "
                                          ".*set device_sharing = 'time_slicing'"):
        AsyncTrainer._start_device_sharing(_trainer_asking("concurrent", CpuPlatform(), []))


class SharingPlatform(CpuPlatform):
    """The CPU, with the sharing of a platform that has one (what the trainer does with it is under test)."""

    concurrent_sharing_faster = True

    def __init__(self, control):
        self.control = control

    def start_device_sharing(self, compute_shares=(1.0,)):
        self.shares = compute_shares
        return start_mps(compute_shares, binary=str(self.control), check_client=False)


@pytest.fixture
def control(tmp_path, monkeypatch):
    """A stand-in for ``nvidia-cuda-mps-control`` that records how it was called (its arguments, its input and
    the daemon folders it was given) and daemonizes as the real one does: by returning at once."""
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    record = tmp_path / "calls"
    script = tmp_path / "nvidia-cuda-mps-control"
    script.write_text(f'#!/bin/sh\necho "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY input=$(cat)" >> {record}\n'
                      f'[ "$FAIL" = 1 ] && {{ echo "cannot start" >&2; exit 1; }}\n'
                      '[ "$HANG" = 1 ] && [ "$1" = -d ] && sleep 10\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return types.SimpleNamespace(binary=script, calls=record)


def test_a_daemon_of_the_jobs_own_is_started_handed_to_the_workers_and_stopped(control, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines: list[str] = []
    platform = SharingPlatform(control.binary)
    sharing = AsyncTrainer._start_device_sharing(_trainer_asking("concurrent", platform, lines))
    assert platform.shares == (0.75, 1.0)  # the trainer's share and the engine's are the ones checked
    pipe = sharing.env()["CUDA_MPS_PIPE_DIRECTORY"]
    assert os.path.isdir(pipe) and os.path.isdir(sharing.env()["CUDA_MPS_LOG_DIRECTORY"])
    assert sharing.env(0.75) == sharing.env() | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in sharing.env(1.0)
    assert lines == ["device sharing: concurrent through CUDA MPS (a daemon of this job's own): the trainer's kernels "
                     "may use 75% of each device's compute units, the engine's all (async_training.device_sharing, "
                     "trainer_compute_share)"]
    sharing.stop()
    assert control.calls.read_text().splitlines() == [f"args=-d pipe={pipe} input=", f"args= pipe={pipe} input=quit"]
    assert not os.path.exists(os.path.dirname(pipe))  # its folders are gone


def test_a_limited_share_is_named_first_when_the_values_stop_being_finite(control, monkeypatch):
    """Under MPS at 75% of an H100's SMs a job's losses were NaN from step 1 though the start check passed,
    and the error advised a lower learning rate (2026-12-06): the share is now the first suspect."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    trainer = _trainer_asking("concurrent", SharingPlatform(control.binary), [])
    sharing = AsyncTrainer._start_device_sharing(trainer)
    try:
        with pytest.raises(RlcoreError) as stopped:
            trainer.nonfinite.check(1, {"actor/kl_loss": float("nan"), "actor/nonfinite_updates": 1.0})
    finally:
        sharing.stop()
    message = str(stopped.value)
    assert "limited to 75% of each device's compute units" in message
    assert "async_training.device_sharing = 'time_slicing'" in message and "Lower actor.optim.lr" not in message


def test_a_daemon_that_does_not_start_is_an_error_with_its_words_and_leaves_no_folder(control, monkeypatch,
                                                                                        tmp_path):
    monkeypatch.setenv("FAIL", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(SharingUnavailable, match="nvidia-cuda-mps-control -d exited with 1: cannot start"):
        start_mps((0.8,), binary=str(control.binary), check_client=False)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_client_that_cannot_compute_under_the_daemon_stops_it(control):
    """The check runs a real client process; on this machine (no GPU) it cannot start, so sharing is refused
    with the client's error and the daemon is told to quit."""
    with pytest.raises(SharingUnavailable, match="a CUDA process limited to 80% of the GPU's streaming "
                                                 "multiprocessors could not start under the MPS daemon"):
        start_mps((0.8,), binary=str(control.binary))
    assert control.calls.read_text().splitlines()[-1].endswith("input=quit")


def test_a_daemon_that_gives_no_answer_is_refused_stopped_and_leaves_no_folder(control, monkeypatch, tmp_path):
    """A start past the deadline raised subprocess's own TimeoutExpired: ``auto`` could not fall back to taking
    turns, and the daemon's folder stayed."""
    monkeypatch.setattr(cuda_mps, "DAEMON_START_S", 1)
    monkeypatch.setenv("HANG", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(SharingUnavailable, match="nvidia-cuda-mps-control -d gave no answer within 1 s"):
        start_mps((0.5,), binary=str(control.binary))
    assert control.calls.read_text().splitlines()[-1].endswith("input=quit")  # told to quit, had it started late
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_share_that_computes_wrong_names_the_value_to_change(control, monkeypatch):
    """The check runs each share the job uses, the engine's too, and the advice named trainer_compute_share
    whichever share failed."""
    monkeypatch.setattr(cuda_mps, "CLIENT_CHECK", "import os\nwrong = os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE') "
                                                  "== '60'\nprint(330.0 if wrong else 0.1)\nraise SystemExit(3 if wrong "
                                                  "else 0)\n")
    with pytest.raises(SharingUnavailable) as refused:
        start_mps((0.5, 0.6), binary=str(control.binary))
    assert "limited to 60% of the GPU's streaming multiprocessors computed a bf16 matrix product wrong (max error " \
           "330.0)" in str(refused.value)
    assert "give the async_training key set to 0.6 (trainer_compute_share or engine_compute_share) another value " \
           "(0.5 computed" in str(refused.value)
    assert control.calls.read_text().splitlines()[-1].endswith("input=quit")


def test_a_daemon_the_machine_already_runs_is_joined_and_left_running(control, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    sharing = start_mps((0.8,), binary=str(control.binary), check_client=False)
    assert sharing.env(0.8) == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "theirs"),
                                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80"}
    sharing.stop()
    assert not control.calls.exists()  # never started, never stopped
    assert "the machine's running daemon" in sharing.description


def test_the_shares_are_checked_under_the_machines_daemon_too_and_it_is_left_running(control, monkeypatch,
                                                                                      tmp_path):
    """Joining the machine's daemon skipped the check of the shares (60-80% computed wrong on an H200)."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "theirs"))
    with pytest.raises(SharingUnavailable, match="a CUDA process limited to 80% of the GPU's streaming "
                                                 "multiprocessors could not start under the MPS daemon"):
        start_mps((0.8,), binary=str(control.binary))
    assert not control.calls.exists()  # neither started nor stopped


def test_auto_shares_concurrently_where_the_platform_measured_it_faster(control, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines: list[str] = []
    sharing = AsyncTrainer._start_device_sharing(_trainer_asking("auto", SharingPlatform(control.binary), lines))
    try:
        assert sharing is not None and "CUDA_MPS_PIPE_DIRECTORY" in sharing.env()
        assert lines == ["device sharing: auto -> concurrent through CUDA MPS (a daemon of this job's own): the "
                         "trainer's kernels may use 75% of each device's compute units, the engine's all "
                         "(async_training.device_sharing, trainer_compute_share)"]
    finally:
        sharing.stop()


def test_auto_takes_turns_saying_why_where_sharing_is_not_the_measured_win_or_cannot_start(control, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    turns = "device sharing: auto -> time slicing, the trainer and the engine take turns on each device: "
    lines: list[str] = []
    assert AsyncTrainer._start_device_sharing(_trainer_asking("auto", CpuPlatform(), lines)) is None
    assert lines == [turns + "the cpu platform's concurrent sharing is not measured faster than taking turns "
                             "(async_training.device_sharing)"]
    lines.clear()  # a cluster: the daemon would serve this machine alone
    assert AsyncTrainer._start_device_sharing(_trainer_asking("auto", SharingPlatform(control.binary), lines,
                                                              nnodes=2)) is None
    assert lines == [turns + "the sharing starts on this machine only, and the job runs on a Ray cluster "
                             "(trainer.nnodes, trainer.ray_address or RAY_ADDRESS) (async_training.device_sharing)"]
    lines.clear()  # the daemon does not start: its words, and the job goes on taking turns
    monkeypatch.setenv("FAIL", "1")
    assert AsyncTrainer._start_device_sharing(_trainer_asking("auto", SharingPlatform(control.binary), lines)) is None
    assert len(lines) == 1 and lines[0].startswith(turns + "nvidia-cuda-mps-control -d exited with 1: cannot start")


def test_where_auto_sharing_fails_to_start_the_arrangement_chosen_for_it_becomes_one_engine(control, monkeypatch,
                                                                                            sized_model, tmp_path):
    """The arrangement by size (two engines at 135M, meant to run beside the trainer's kernels) is chosen before
    the daemon starts; where it then refuses, ``auto`` takes turns, and the trainer chooses again, before any
    worker starts: one engine, said in a second arrangement line, and recorded in run.toml (which had kept the
    first choice). A key the job set stays as set."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    model = sized_model(135_000_000)
    platform = SharingPlatform(control.binary)

    def trainer_for(*overrides, model=model):
        lines: list[str] = []
        given = load_job(None, ['async_training.mode="colocated"', f'model.path="{model}"', *overrides])
        job, arrangement = arranged(given, platform)
        # as auto's choice of the colocated form would say it (on a GPU; this platform is the CPU's)
        choice = ModeChoice("colocated", colocated_reason(job.config, platform, job.config.section(
            "async_training").engines_per_device))
        trainer = types.SimpleNamespace(job=job, config=job.config, settings=job.config.section("async_training"),
                                        platform=platform, echo=lines.append, nonfinite=NonFiniteGuard(0),
                                        unarranged=given, arrangement=arrangement, run_dir=tmp_path / "run",
                                        manager=None, mode_choice=choice)
        for method in ("_arrange_for_turns", "_write_record"):
            setattr(trainer, method, types.MethodType(getattr(AsyncTrainer, method), trainer))
        trainer._write_record()  # as the job starts, before the sharing
        return trainer, lines

    trainer, lines = trainer_for()
    assert trainer.settings.engines_per_device == 2  # by size, for kernels side by side
    assert read_toml(tmp_path / "run" / "run.toml")["async_training"]["engines_per_device"] == 2
    monkeypatch.setenv("FAIL", "1")
    assert AsyncTrainer._start_device_sharing(trainer) is None
    section = trainer.config.section("async_training")
    assert trainer.settings is section and trainer.job.config is trainer.config
    assert (section.engines_per_device, section.trainer_compute_share, section.kernel_priority) == (1, 0.5, "equal")
    recorded = read_toml(tmp_path / "run" / "run.toml")["async_training"]
    assert (recorded["engines_per_device"], recorded["trainer_compute_share"]) == (1, 0.5)
    reason = json.loads((tmp_path / "run" / "environment.json").read_text())["async_mode"]["reason"]
    assert "the engine runs in a process of its own" in reason and "2 engines" not in reason
    assert lines[0].startswith("device sharing: auto -> time slicing") and len(lines) == 2
    assert lines[1].startswith("colocated arrangement: async_training.engines_per_device = 1, ")
    assert lines[1].endswith("one engine: the processes will take turns on the device, nvidia-cuda-mps-control -d "
                             "exited with 1: cannot start (async_training.device_sharing = 'auto')")
    trainer, lines = trainer_for("async_training.engines_per_device=2")
    assert AsyncTrainer._start_device_sharing(trainer) is None
    assert trainer.settings.engines_per_device == 2 and len(lines) == 1  # as the job sets: unchanged, no new line
    # at 1.5B rlcore put the trainer's kernels first; taking turns, no priority is left to go unused
    trainer, lines = trainer_for(model=sized_model(1_400_000_000))
    assert trainer.settings.kernel_priority == "trainer"
    assert AsyncTrainer._start_device_sharing(trainer) is None
    assert trainer.settings.kernel_priority == "equal" and "kernel_priority" not in lines[0]
    assert lines[1].startswith("colocated arrangement: async_training.engines_per_device = 1, trainer_compute_share "
                               "= 0.5, engine_compute_share = 1, kernel_priority = 'equal'")


def test_nvidias_platform_declares_concurrent_sharing_faster_amds_and_the_cpu_do_not():
    from rlcore.runtime.platforms import CudaPlatform
    from rlcore_rocm.platform import RocmPlatform

    assert CudaPlatform.concurrent_sharing_faster is True
    assert RocmPlatform.concurrent_sharing_faster is False and CpuPlatform.concurrent_sharing_faster is False


def test_amds_platform_and_the_cpu_have_no_side_by_side_kernels_and_say_so_before_starting(monkeypatch):
    """The ROCm platform inherited CUDA's MPS start, NVIDIA's alone: with device_sharing = "concurrent" it
    looked for nvidia-cuda-mps-control on an AMD machine."""
    from rlcore_rocm.platform import RocmPlatform

    for platform in (RocmPlatform(), CpuPlatform()):
        said = f"the {platform.name} platform has no way to run two processes' kernels side by side"
        assert platform.device_sharing_missing() == said
        with pytest.raises(SharingUnavailable, match=said):
            platform.start_device_sharing((0.5, 1.0))


def test_the_engine_can_be_held_to_a_share_checked_and_named_as_the_trainers_is(control, monkeypatch):
    """A 1.5B job's step waits for the trainer, whose passes took ~1.6x as long at half the SMs (2026-12-07):
    the engine, with time to spare, is the side to hold back there."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines: list[str] = []
    platform = SharingPlatform(control.binary)
    trainer = _trainer_asking("concurrent", platform, lines, engine_share=0.5)
    sharing = AsyncTrainer._start_device_sharing(trainer)
    try:
        assert platform.shares == (0.75, 0.5)  # both checked at start
        assert sharing.env(0.5)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert lines == ["device sharing: concurrent through CUDA MPS (a daemon of this job's own): the trainer's "
                         "kernels may use 75% of each device's compute units, the engine's 50% "
                         "(async_training.device_sharing, trainer_compute_share, engine_compute_share)"]
        with pytest.raises(RlcoreError) as stopped:
            trainer.nonfinite.check(1, {"actor/kl_loss": float("nan"), "actor/nonfinite_updates": 1.0})
        assert "The engine's kernels run under CUDA MPS" in str(stopped.value)
        assert "another async_training.engine_compute_share" in str(stopped.value)
    finally:
        sharing.stop()


def test_the_engine_share_is_a_setting_with_bounds():
    assert settings().engine_compute_share is None  # chosen at start (rlcore.asynchronous.arrangement)
    assert settings("async_training.engine_compute_share=0.5").engine_compute_share == 0.5
    with pytest.raises(RlcoreError, match="async_training.engine_compute_share: must be > 0.0, got 0.0"):
        settings("async_training.engine_compute_share=0")


@pytest.mark.parametrize("first, yielding", [("trainer", "engine"), ("engine", "trainer")])
def test_kernel_priority_puts_the_other_sides_processes_below_normal(control, monkeypatch, first, yielding):
    """The side whose kernels go first keeps MPS's normal client priority; the other side's processes join
    with CUDA_MPS_CLIENT_PRIORITY = 1 (below normal), each with its own compute share as before."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    lines: list[str] = []
    trainer = _trainer_asking("concurrent", SharingPlatform(control.binary), lines, priority=first)
    trainer.sharing = AsyncTrainer._start_device_sharing(trainer)
    try:
        envs = {side: AsyncTrainer._sharing_env(trainer, side) for side in ("trainer", "engine")}
        assert envs[yielding]["CUDA_MPS_CLIENT_PRIORITY"] == "1"
        assert "CUDA_MPS_CLIENT_PRIORITY" not in envs[first]
        assert envs["trainer"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"  # the share stays the trainer's
        assert lines[0].endswith(f"; the {first}'s kernels go first, the {yielding}'s at a lower priority "
                                 "(async_training.kernel_priority)")
    finally:
        trainer.sharing.stop()


def test_equal_priority_sets_no_client_priority_and_time_slicing_says_a_priority_goes_unused(control, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    trainer = _trainer_asking("concurrent", SharingPlatform(control.binary), [])
    trainer.sharing = AsyncTrainer._start_device_sharing(trainer)
    try:
        assert not any("CUDA_MPS_CLIENT_PRIORITY" in AsyncTrainer._sharing_env(trainer, side)
                       for side in ("trainer", "engine"))
    finally:
        trainer.sharing.stop()
    lines: list[str] = []  # auto on a platform without sharing: the priority has nothing to order
    assert AsyncTrainer._start_device_sharing(_trainer_asking("auto", CpuPlatform(), lines, priority="trainer")) is None
    assert "(async_training.kernel_priority = 'trainer' goes unused)" in lines[0]
    assert settings().kernel_priority is None  # unset: the arrangement chooses it (tests/asynchronous/test_arrangement.py)
