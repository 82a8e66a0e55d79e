"""Use privileges a sandboxed process must not hold: capabilities (set the hostname, open a raw
socket) and a cleared no_new_privs. Holding any of them is an escape."""

import errno
import socket

from _common import attempt


def status(field):
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith(field + ":"))


def held(field, empty):
    if status(field) == empty:
        raise PermissionError(errno.EPERM, f"{field} {empty}")
    return f"{field} {status(field)}"


for field in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
    attempt(f"hold capabilities ({field})", lambda f=field: held(f, "0000000000000000"))
attempt("run without no_new_privs", lambda: held("NoNewPrivs", "1"))
attempt("sethostname", lambda: socket.sethostname("escaped"))
attempt("open a raw packet socket",
        lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close())
