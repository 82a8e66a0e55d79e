"""Create sockets of address families a network namespace does not isolate (AF_VSOCK reaches
the hypervisor from any namespace) and of other kernel surface: each argument is
NAME=FAMILY:TYPE (those the host lets this user create). Only created, never connected:
creating one is already the escape."""

import socket

from _common import ARGS, attempt

for entry in ARGS:
    name, _, rest = entry.partition("=")
    family, _, kind = rest.partition(":")
    attempt(f"socket {name}", lambda f=int(family), k=int(kind): socket.socket(f, k).close())
