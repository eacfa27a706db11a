"""rlcore.runtime.stopping: a stop signal raises Stopped (exit 128 + signal) so clean-up runs; a second one
kills every process the driver started and exits at once; Ray's start cannot replace the handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from rlcore.runtime.stopping import Stopped, descendants, keep_handlers, stop_on_signals
from tests.processes import kill_family

SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    from rlcore.runtime.stopping import Stopped, stop_on_signals

    try:
        with stop_on_signals(echo=lambda line: print(line, flush=True)):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            try:
                print("child", child.pid, flush=True)
                time.sleep(300)
            finally:
                print("cleaning up", flush=True)
                time.sleep(float(sys.argv[1]))  # a clean-up that takes this long
                child.kill()
    except Stopped as exc:
        print("stopped", exc.exit_code, flush=True)
        sys.exit(exc.exit_code)
""")


def _start(tmp_path, cleanup_s: float) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "stoppable.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(cleanup_s)], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    line = process.stdout.readline()
    assert line.startswith("child "), line
    return process, int(line.split()[1])


def _lines_until(process: subprocess.Popen, text: str) -> list[str]:
    lines = []
    while not lines or text not in lines[-1]:
        line = process.stdout.readline()
        assert line, f"the process ended before printing {text!r}: {lines}"
        lines.append(line)
    return lines


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_runs_the_clean_up_and_exits_with_128_plus_its_number(tmp_path, signum):
    process, child = _start(tmp_path, cleanup_s=0)
    try:
        process.send_signal(signum)
        lines = _lines_until(process, "stopped")
        assert process.wait(timeout=30) == 128 + signum
    finally:
        kill_family(process)
    assert any(f"{signal.Signals(signum).name} received" in line for line in lines), lines
    assert any("cleaning up" in line for line in lines), lines
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_second_signal_kills_what_the_driver_started_and_exits_at_once(tmp_path):
    process, child = _start(tmp_path, cleanup_s=120)  # the clean-up would hang for two minutes
    try:
        process.send_signal(signal.SIGTERM)
        _lines_until(process, "cleaning up")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 143  # the first signal's status
        assert time.monotonic() - started < 10
    finally:
        kill_family(process)
    assert psutil.wait_procs([psutil.Process(child)] if psutil.pid_exists(child) else [], timeout=10)[1] == []


def test_stopped_is_a_keyboard_interrupt_that_knows_its_status():
    stop = Stopped(signal.SIGTERM)
    assert isinstance(stop, KeyboardInterrupt) and stop.exit_code == 143 and str(stop) == "SIGTERM"


def test_a_stop_that_a_library_turned_into_a_plain_keyboard_interrupt_is_still_the_signals_stop():
    """Ray's ``ray.get`` and ``ray.wait`` run the handler inside their own signal check, catch the
    ``Stopped`` it raises and raise ``KeyboardInterrupt()`` instead (a SIGTERM then exited 130, not 143)."""
    def stop_turned_plain(*, signalled: bool) -> KeyboardInterrupt:
        # caught here, not by pytest.raises: a KeyboardInterrupt that escapes would end the test session
        try:
            with stop_on_signals(echo=lambda line: None):
                if signalled:
                    try:
                        signal.raise_signal(signal.SIGTERM)
                    except Stopped:
                        raise KeyboardInterrupt from None  # what Ray's wait does with it
                raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            return exc

    stopped = stop_turned_plain(signalled=True)
    assert isinstance(stopped, Stopped) and stopped.exit_code == 143 and stopped.signum == signal.SIGTERM, repr(stopped)
    assert not isinstance(stop_turned_plain(signalled=False), Stopped)  # no signal came: it stays what it was


def test_handlers_set_by_a_library_inside_keep_handlers_are_replaced_by_the_previous_ones():
    before = signal.getsignal(signal.SIGTERM)  # not always SIG_DFL: ray.init in an earlier test sets its own
    with stop_on_signals():
        ours = signal.getsignal(signal.SIGTERM)
        with keep_handlers():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does at the C level
        assert signal.getsignal(signal.SIGTERM) is ours
        with pytest.raises(Stopped):
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before  # restored on leaving the block


def test_descendants_finds_grandchildren():
    process = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                                "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        found = descendants(process.pid)
        assert len(found) == 1 and psutil.Process(found[0]).ppid() == process.pid
        assert process.pid in descendants(psutil.Process().pid)
    finally:
        kill_family(process)


def test_a_stop_survives_pickling_as_torchs_checkpoint_gathers_it():
    """A SIGTERM landing inside ``dcp.save`` is gathered to its coordinator by pickle; rebuilding it failed
    ("'SIGTERM' is not a valid Signals") and the job died with exit 1 instead of 143 (CI, 2026-12-03)."""
    import pickle
    import signal

    from rlcore.runtime.stopping import Stopped

    again = pickle.loads(pickle.dumps(Stopped(signal.SIGTERM)))
    assert isinstance(again, Stopped) and again.signum == signal.SIGTERM and again.exit_code == 143
    assert str(again) == "SIGTERM"


def test_a_stop_inside_a_checkpoint_write_comes_out_as_the_stop_and_leaves_no_folder(tmp_path):
    """torch's distributed checkpoint wraps what its planning raises in a CheckpointException (a job
    stopped there exited 1, not 143); the folder write hands the stop on as itself."""
    import signal

    import pytest
    import torch
    import torch.distributed.checkpoint as dcp

    from rlcore.runtime.distributed import write_folder
    from rlcore.runtime.stopping import Stopped

    class StopWhilePlanning(dcp.DefaultSavePlanner):
        def create_local_plan(self):
            raise Stopped(signal.SIGTERM)

    def write(staging):
        dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(staging / "shards"), planner=StopWhilePlanning(),
                 no_dist=True)

    with pytest.raises(Stopped) as stopped:
        write_folder(tmp_path / "checkpoint", write, lambda staging: None)
    assert stopped.value.exit_code == 143
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor its staging folder
