"""The sandbox's launcher: run as root by ``rlcore.sandbox.run_code``, standard library only.

It reads a JSON spec on stdin, then, single-threaded (which ``preexec_fn`` in a threaded trainer is
not): new mount, pid and network namespaces; a private tmpfs over /tmp (the fresh working
directory), /dev/shm and /var/tmp; the interpreter made visible to an unprivileged user when it
lives under a private home (/root); then it forks the code's process, pid 1 of the new pid
namespace, which takes the resource limits, drops to an unprivileged uid (so that RLIMIT_NPROC
holds: the kernel does not enforce it for root) and execs the interpreter on the code.

When pid 1 exits, the kernel kills everything else in its pid namespace, so no forked child
outlives the run; when this launcher is killed (the caller's timeout), pid 1 gets SIGKILL through
PR_SET_PDEATHSIG. What it achieved is written as one JSON line to the report fd.
"""

import ctypes
import json
import os
import resource
import stat
import sys

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None) -> None:
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def private_tmpfs(target: str, size: int) -> None:
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")


def world_can_enter(path: str) -> bool:
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def expose_interpreter(prefix: str) -> None:
    """Make ``prefix`` (the interpreter's install) readable to any user, at the same path, read-only:
    under a directory others cannot enter (root's home), that directory is covered with an empty
    tmpfs (hiding the rest of it) and the prefix alone is bind-mounted back."""
    parts = prefix.rstrip("/").split("/")
    closed = next(("/".join(parts[:i]) for i in range(2, len(parts) + 1)
                   if not world_can_enter("/".join(parts[:i]))), None)
    if closed is None:
        return
    staging = "/tmp/.interpreter"
    os.mkdir(staging)
    mount(prefix, staging, None, MS_BIND | MS_REC)
    mount("tmpfs", closed, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    os.makedirs(prefix, mode=0o755, exist_ok=True)
    mount(staging, prefix, None, MS_MOVE)
    mount(None, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    os.rmdir(staging)


def child(spec: dict, report: int) -> None:
    """pid 1 of the new pid namespace: becomes the code's process."""
    os.close(report)
    try:
        # /proc of this pid namespace: the code sees its own processes only
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    uid = spec["uid"]
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, uid, uid)
    with open(os.path.join(work, "main.py"), "w") as f:
        f.write(spec["code"])
    os.chown(os.path.join(work, "main.py"), uid, uid)
    stdin = os.open(os.path.join(work, ".stdin"), os.O_RDWR | os.O_CREAT, 0o600)
    os.write(stdin, spec["stdin"].encode())
    os.lseek(stdin, 0, os.SEEK_SET)
    os.unlink(os.path.join(work, ".stdin"))
    os.dup2(stdin, 0)
    os.close(stdin)
    os.chdir(work)
    limits = spec["limits"]
    for name, value in (("RLIMIT_AS", limits["memory_bytes"]), ("RLIMIT_NPROC", limits["processes"]),
                        ("RLIMIT_FSIZE", limits["file_size_bytes"]), ("RLIMIT_NOFILE", limits["open_files"]),
                        ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    # the soft CPU limit sends SIGXCPU, the hard one a second later SIGKILL
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # after setuid: a change of credentials clears the parent-death signal
    _check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "pdeathsig")
    os.execve(spec["interpreter"], [spec["interpreter"], "-I", "-B", "main.py"], spec["env"])


def main() -> None:
    report = int(sys.argv[1])
    spec = json.loads(sys.stdin.buffer.read())
    status = {"network_isolated": False}
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID
        _check(libc.unshare(flags), "unshare(mount, pid)")
        try:
            _check(libc.unshare(CLONE_NEWNET), "unshare(net)")
            status["network_isolated"] = True
        except OSError as exc:
            if spec["require_network_isolation"]:
                raise
            status["network_error"] = str(exc)
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host
        for target in ("/tmp", "/dev/shm", "/var/tmp"):
            if os.path.isdir(target):
                private_tmpfs(target, spec["limits"]["tmpfs_bytes"])
        expose_interpreter(spec["prefix"])
    except OSError as exc:
        status["error"] = str(exc)
        os.write(report, (json.dumps(status) + "\n").encode())
        os._exit(125)
    os.write(report, (json.dumps(status) + "\n").encode())
    pid = os.fork()
    if pid == 0:
        try:
            child(spec, report)
        except BaseException as exc:  # noqa: BLE001 - the launcher's failure, told on stderr
            os.write(2, f"rlcore sandbox: {exc}\n".encode())
        os._exit(125)
    # the caller kills pid 1 by this pid on a timeout, then waits for this launcher: pid 1 is reaped
    # (and this launcher exits) only once every process of its namespace is gone
    os.write(report, (json.dumps({"pid": pid}) + "\n").encode())
    os.close(report)
    _, status_code = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status_code):
        os._exit(128 + os.WTERMSIG(status_code))
    os._exit(os.WEXITSTATUS(status_code))


if __name__ == "__main__":
    main()
