"""Use privileges a sandboxed process must not hold: capabilities (set the hostname, open a raw
socket) and a cleared no_new_privs. Holding any of them is an escape."""

import socket

from _common import ARGS, Refused, attempt


def status(field):
    with open("/proc/self/status") as f:
        return next(line.split()[1] for line in f if line.startswith(field + ":"))


def held(field, empty):
    if status(field) == empty:
        raise Refused("NONE_HELD" if field.startswith("Cap") else "SET", f"{field} {empty}")
    return f"{field} {status(field)}"


# Rootless (argv: the host user), a user namespace gives the command no capability whatever the
# layers: only no_new_privs and the raw socket are attempts then. With "shared-uts" (the
# landlock tier: the hostname is the host's), setting the hostname is not tried: where a layer
# is switched off, it would rename the host.
if ARGS[0] == "root":
    for field in ("CapEff", "CapPrm", "CapBnd"):  # (the ambient set is empty unless raised)
        attempt(f"hold capabilities ({field})", lambda f=field: held(f, "0000000000000000"))
    if "shared-uts" not in ARGS[1:]:
        attempt("sethostname", lambda: socket.sethostname("escaped"))
attempt("run without no_new_privs", lambda: held("NoNewPrivs", "1"))
attempt("open a raw packet socket",
        lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close())
