"""Use a descriptor the launching process left inheritable (its number is the argument; every
other descriptor from 3 up is looked at too): an inherited socket that carries data is an
escape (the host side sees what arrives)."""

import os
import socket
import stat

from _common import ARGS, Refused, attempt, note


def _is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


def find():
    found = [fd for fd in range(3, 1024) if _is_socket(fd)]
    if not found:
        raise Refused("NO_SOCKET", "no inherited socket")
    return f"sockets at {found}"


def talk(fd):
    s = socket.socket(fileno=os.dup(fd))
    s.sendall(b"ping from the sandbox")
    s.close()
    return "sent"


note("open descriptors", " ".join(sorted(os.listdir("/proc/self/fd"), key=int)))
leaked = int(ARGS[0])
if attempt("find an inherited socket", find):
    attempt(f"talk through descriptor {leaked}", lambda: talk(leaked))
