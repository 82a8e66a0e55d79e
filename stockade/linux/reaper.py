"""The sandbox's small pid 1: reaper.c, a static program pid 1 turns into once the command
has run for GRACE seconds.

pid 1 is a Python process cloned from the zygote (init.py). Short commands end within its
first poll, and never pay for an exec; a command that keeps running gets a pid 1 of under
1 MiB RSS instead of an interpreter's ≈ 15 MiB. The program is copied once per process
(the zygote, or the CLI) into a sealed memfd before any sandbox exists, and pid 1 execs that
copy: neither what a command writes to the installed file while that process lives, nor
anything in the sandbox's view (it is linked statically), can change what pid 1 runs. It is
built at install time (setup.py); where it was not, pid 1 stays Python, and `stockade report`
says so (`idle_pid1`).
"""

from __future__ import annotations

import fcntl
import functools
import os
import signal

GRACE = 0.1  # seconds the command runs under the Python pid 1 before it execs the reaper
PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper")
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def built() -> bool:
    return os.access(PROGRAM, os.X_OK)


@functools.cache
def descriptor() -> int | None:
    """A sealed memfd holding the program (one per process, kept open), or None."""
    try:
        program = os.open(PROGRAM, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    fd = os.memfd_create("stockade-reaper", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    try:
        size, copied = os.fstat(program).st_size, 0
        while copied < size:  # (in the kernel: ≈ 0.3 ms, a third of read and write)
            sent = os.sendfile(fd, program, copied, size - copied)
            if not sent:
                raise OSError("the reaper changed size while being copied")
            copied += sent
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        return None
    finally:
        os.close(program)
    return fd


def become(fd: int, command: int, lifeline_fd: int, status_fd: int) -> None:
    """Replace this process (pid 1) by the reaper; returns only if that could not be done.

    The exec ends pid 1's starter thread, one of the INIT_THREADS that RLIMIT_NPROC allows
    beside the command's `pids`. A `reaper hold` child takes its place first, so that the
    command never gets that slot; if the command holds every process it may, the child cannot
    be made, and pid 1 stays as it is."""
    try:
        holder = os.posix_spawn(f"/proc/self/fd/{fd}", ["reaper", "hold"], {})
    except OSError:
        return
    for inherited in (lifeline_fd, status_fd):
        os.set_inheritable(inherited, True)
    try:
        os.execve(fd, ["reaper", str(command), str(lifeline_fd), str(status_fd)], {})
    except OSError:
        for inherited in (lifeline_fd, status_fd):
            os.set_inheritable(inherited, False)
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
