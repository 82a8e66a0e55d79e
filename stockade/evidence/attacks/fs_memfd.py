"""Execute written memory: a memfd filled with a program, by fexecve and by its /proc path.
Running it is an escape from exec_from_write = false."""

import os
import subprocess

from _common import CannotTry, attempt


def memfd_program():
    fd = os.memfd_create("payload", 0)
    with open("/usr/bin/true", "rb") as f:
        os.write(fd, f.read())
    return fd


def fexecve():
    fd = memfd_program()
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, ["payload"], {})
        except OSError as exc:
            os._exit(100 + exc.errno)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if status >= 100:
        raise OSError(status - 100, os.strerror(status - 100))
    return "it ran"


def by_path():
    fd = memfd_program()
    done = subprocess.run([f"/proc/self/fd/{fd}"], pass_fds=[fd], capture_output=True)
    if done.returncode:  # (an exec refused raised its errno above)
        raise CannotTry(f"it exited {done.returncode}")
    return "it ran"


attempt("fexecve a memfd", fexecve)
attempt("execve /proc/self/fd/N of a memfd", by_path)
