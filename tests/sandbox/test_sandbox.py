"""The sandbox against hostile code: each case must end, within its limits, leaving this process and
the machine untouched. Limits are tiny so a fork bomb on a 2-core CI machine ends in well under a second."""

import os
import socket
import subprocess
import sys
import textwrap

import attrs
import psutil
import pytest

from rlcore.sandbox import SandboxError, SandboxLimits, run_code

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (as in CI) to isolate code")

TIGHT = SandboxLimits(timeout_s=3.0, cpu_seconds=2, memory_bytes=256 << 20, processes=8,
                      file_size_bytes=1 << 20, open_files=32, max_output_bytes=8192)


def run(code: str, limits: SandboxLimits = TIGHT, **kwargs):
    return run_code(textwrap.dedent(code), limits, **kwargs)


def no_leftovers(before: set[int]) -> None:
    """No process started during the case is still alive (the pid namespace took them all)."""
    leftover = [p for p in psutil.process_iter(["pid", "uids"]) if p.info["pid"] not in before
                and p.info["uids"] and p.info["uids"].real >= 200_000]
    assert leftover == [], leftover


@pytest.fixture
def pids():
    return {p.pid for p in psutil.process_iter()}


def test_plain_code_runs_with_stdin_and_output():
    result = run("import sys; print(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 3")
    assert result.ok and result.stdout == "6\n" and result.network_isolated


def test_child_count_is_capped_before_any_fork_bomb():
    # harmless: keep children alive and count how many could be made
    result = run("""
        import os, time
        made = 0
        for _ in range(20):
            try:
                if os.fork() == 0:
                    time.sleep(2); os._exit(0)
                made += 1
            except OSError:
                break
        print(made)
    """)
    assert result.exit_code == 0
    assert int(result.stdout) < TIGHT.processes  # the code's own process counts against the limit


def test_fork_bomb_ends_and_leaves_nothing(pids):
    result = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, attrs.evolve(TIGHT, timeout_s=1.5, cpu_seconds=1))
    assert result.exit_code != 0 or result.timed_out
    assert result.duration_s < 5
    no_leftovers(pids)


def test_infinite_loop_is_stopped_by_cpu_limit():
    result = run("while True: pass", attrs.evolve(TIGHT, cpu_seconds=1, timeout_s=10))  # slack for a busy CI
    # the code is pid 1 of its namespace, which ignores SIGXCPU: the hard limit's SIGKILL a second later
    assert not result.timed_out and result.exit_code == 128 + 9


def test_sleeping_code_is_killed_at_the_wall_clock_deadline(pids):
    result = run("""
        import os, time
        os.setsid() if os.fork() == 0 else None  # a child that leaves the process group
        time.sleep(60)
    """, SandboxLimits(timeout_s=1.0))
    assert result.timed_out and result.exit_code is None and result.duration_s < 3
    no_leftovers(pids)


def test_memory_bomb_fails_inside_the_sandbox():
    result = run("x = bytearray(1 << 30)")
    assert result.exit_code != 0 and "MemoryError" in result.stderr


def test_huge_print_is_cut_and_killed():
    result = run("while True: print('x' * 10000)")
    assert result.output_truncated and len(result.stdout) <= TIGHT.max_output_bytes and not result.ok


def test_big_file_is_stopped_by_file_size_limit():
    result = run("open('big', 'wb').write(b'0' * (2 << 20))")
    # the write past the limit fails with EFBIG (Python ignores SIGXFSZ), not some other error
    assert result.exit_code == 1 and "OSError: [Errno 27] File too large" in result.stderr, result.stderr
    assert run("open('small', 'wb').write(b'0' * (1 << 19)); print('written')").stdout == "written\n"


def test_writes_outside_its_directory_fail(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("safe")
    result = run(f"""
        import os
        hits = []
        for path in [{str(target)!r}, {str(tmp_path / 'new.txt')!r}, '/etc/rlcore-sandbox-test', '/root/x']:
            try:
                open(path, 'w').write('pwned'); hits.append(path)
            except OSError:
                pass
        open('/tmp/scratch', 'w').write('private tmpfs')  # its own /tmp, gone after the run
        print(hits)
    """)
    assert result.exit_code == 0 and result.stdout.strip() == "[]"
    assert target.read_text() == "safe" and not (tmp_path / "new.txt").exists()
    assert not os.path.exists("/etc/rlcore-sandbox-test") and not os.path.exists("/tmp/scratch")


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("RLCORE_TEST_SECRET", "hunter2")
    result = run("""
        import os, glob
        seen = [k for k, v in os.environ.items() if 'hunter2' in v or k == 'RLCORE_TEST_SECRET']
        for path in glob.glob('/proc/*/environ'):
            try:
                if b'hunter2' in open(path, 'rb').read(): seen.append(path)
            except OSError:
                pass
        print(seen)
    """)
    assert result.exit_code == 0 and result.stdout.strip() == "[]"


PROBE = """
    import socket
    for address in (('1.1.1.1', 53), ('127.0.0.1', {port})):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(1)
        try:
            s.connect(address); print('connected', address[1])
        except OSError as exc:
            print('refused', address[1], type(exc).__name__)
"""


def test_no_network():
    """A server listening on this machine's loopback, which code outside the sandbox reaches, is out
    of the sandbox's reach (its own network namespace), as is the outside world."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        outside = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE.format(port=port))],
                                 capture_output=True, text=True, timeout=30)
        assert f"connected {port}" in outside.stdout  # the probe itself can connect where nothing isolates it
        result = run(PROBE.format(port=port))
    assert result.exit_code == 0 and "connected" not in result.stdout, result.stdout
    assert f"refused {port}" in result.stdout and "refused 53" in result.stdout


@pytest.mark.parametrize("code,exit_code", [
    ("import sys; sys.exit(3)", 3),
    ("import os; os._exit(7)", 7),
    ("raise SystemExit('bye')", 1),
])
def test_exits_are_reported(code, exit_code):
    assert run(code).exit_code == exit_code


def test_signals_reach_no_one_outside(pids):
    me = os.getpid()
    result = run(f"""
        import os, signal
        for pid in ({me}, {os.getppid()}, 1, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                print(pid, type(exc).__name__)
        os.kill(os.getpid(), signal.SIGTERM)  # pid 1 of its namespace: ignored, as init's are
        print('alive')
    """)
    assert os.getpid() == me  # this test process survived
    assert result.exit_code == 0 and "alive" in result.stdout
    no_leftovers(pids)


def test_refuses_without_network_namespace_unless_allowed(monkeypatch):
    from rlcore.sandbox import boot  # noqa: F401 - the launcher is a script; check the parent's handling
    monkeypatch.setattr("rlcore.sandbox.BOOT", _boot_without_netns(monkeypatch))
    with pytest.raises(SandboxError, match="require_network_isolation"):
        run("print(1)")
    result = run("print(1)", SandboxLimits(require_network_isolation=False))
    assert result.ok and not result.network_isolated


def _boot_without_netns(monkeypatch):
    """A launcher whose network namespace always fails, as on a machine that forbids them."""
    import pathlib
    import tempfile

    from rlcore.sandbox import BOOT

    text = BOOT.read_text().replace('_check(libc.unshare(CLONE_NEWNET), "unshare(net)")',
                                    'raise OSError(1, "unshare(net): Operation not permitted")')
    path = pathlib.Path(tempfile.mkdtemp()) / "boot.py"
    path.write_text(text)
    return path
