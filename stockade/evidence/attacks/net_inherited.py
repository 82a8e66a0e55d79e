"""Look for descriptors inherited from the host (a connected socket in particular) and talk
through every socket found: an inherited socket that carries data is an escape."""

import errno
import os
import socket
import stat

from _common import attempt, note


def sockets():
    found = [fd for fd in range(3, 1024) if _is_socket(fd)]
    if not found:
        raise OSError(errno.EBADF, "no inherited socket")
    return found


def _is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


def talk(fd):
    s = socket.socket(fileno=os.dup(fd))
    s.settimeout(2)
    s.sendall(b"ping")
    return f"reply {s.recv(64)!r}"


note("open descriptors", " ".join(sorted(os.listdir("/proc/self/fd"), key=int)))
if attempt("find an inherited socket", sockets):
    for fd in sockets():
        attempt(f"talk through descriptor {fd}", lambda f=fd: talk(f))
