"""The sandbox's network namespace: loopback up, and the proxy's listener for `allowlist`.

In `allowlist` mode the only way out is Stockade's proxy. Its listener is a TCP socket on the
sandbox's own loopback, created here by the sandbox's pid 1 (so it belongs to the sandbox's
network namespace) and passed out to the owner, whose proxy accepts on it and dials from the
host. Nothing inside the sandbox relays traffic, and no socket file of the host is visible in
it.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    """Bring `lo` up in the current (fresh) network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def proxy_listener(port: int) -> socket.socket:
    """A listening socket on the sandbox's 127.0.0.1:`port`, for the owner's proxy."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock
