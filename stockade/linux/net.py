"""The sandbox's network namespace: loopback up, the proxy's listener for `allowlist`, and the
way out for `any` (open_out).

In `allowlist` mode the only way out is Stockade's proxy. Its listener is a TCP socket on the
sandbox's own loopback, created here by the sandbox's pid 1 (so it belongs to the sandbox's
network namespace) and passed out to the owner, whose proxy accepts on it and dials from the
host. Nothing inside the sandbox relays traffic, and no socket file of the host is visible in
it.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import time

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


GUARD_MESSAGE_MAX = 1 << 20
SETUP_TIMEOUT = 15.0  # seconds pid 1 waits for the owner's guard and for its route out


def open_out(control: int, forwarded: bool = False) -> str:
    """network "any", in pid 1 before anything else of the sandbox is made: install the
    destination guard the owner sends (guard.py), pass the owner the guard's log and this
    namespace's descriptors (for pasta, usernet.py), and wait until the route out exists —
    or the owner says why it will not. Returns the sandbox's own /etc/resolv.conf, which the
    owner sends with the guard (dns.py: one reading of the host's serves both). SetupError
    on every failure, within SETUP_TIMEOUT.
    `forwarded` (tests only: pasta with its port forwarding on, the "usernet_isolation"
    weakening): wait also until pasta's listeners for the host's ports stop appearing, so the
    evidence that it must not forward them does not depend on a race with its start."""
    from stockade.errors import SetupError
    from stockade.linux import fdpass, guard

    sock = socket.socket(fileno=os.dup(control))
    deadline = time.monotonic() + SETUP_TIMEOUT
    try:
        spec = json.loads(_receive(sock, deadline) or b"null")
        if not isinstance(spec, dict):
            raise SetupError("network_setup_failed", "the owner sent no destination guard",
                             stage="network")
        guard.install(spec["nft"], spec["ruleset"])
        log = guard.log_socket()
        own = [os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
               for kind in ("user", "net")]
        try:
            fdpass.send_fds(sock, b"N", [log.fileno(), *own])
        finally:
            log.close()
            for fd in own:
                os.close(fd)
        families = set(spec["families"])
        while not families <= routed_families():
            if time.monotonic() >= deadline:
                raise SetupError("network_setup_failed", "the sandbox's network was not "
                                 f"configured within {SETUP_TIMEOUT:.0f} s", stage="network")
            if select.select([sock], [], [], 0.002)[0]:
                why = sock.recv(4096).decode(errors="replace")
                raise SetupError("network_setup_failed", why or "the owner went away",
                                 stage="network")
        if forwarded:
            _wait_for_forwards(deadline)
        sock.send(b"U")
        return str(spec["resolv_conf"])
    except OSError as exc:
        raise SetupError("network_setup_failed", exc.strerror or str(exc),
                         stage="network") from None
    finally:
        sock.close()


def _wait_for_forwards(deadline: float) -> None:
    """Until this namespace has listening TCP sockets and their number held for 0.3 s."""
    last, steady = -1, 0
    while time.monotonic() < deadline and steady < 6:
        count = 0
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            with open(table) as sockets:
                count += sum(line.split()[3:4] == ["0A"] for line in list(sockets)[1:])
        steady = steady + 1 if count and count == last else 0
        last = count
        time.sleep(0.05)


def _receive(sock: socket.socket, deadline: float) -> bytes:
    """One message (a JSON document, length-prefixed)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from("<I", data)[0]:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return b""
        chunk = sock.recv(GUARD_MESSAGE_MAX)
        if not chunk:
            return b""
        data += chunk
    return data[4:]


def routed_families() -> set[int]:
    """The address families (4, 6) this namespace has a default route for."""
    return {family for family in (4, 6) if default_links(family)}


def default_links(family: int) -> list[str]:
    """The interfaces of this namespace's default routes for `family` (4, 6), in the kernel's
    order (the first is where pasta takes the sandbox's addresses and interface name from)."""
    if family == 4:
        with open("/proc/self/net/route") as routes:
            return [words[0] for words in map(str.split, list(routes)[1:])
                    if words[1:2] == ["00000000"]]
    with open("/proc/self/net/ipv6_route") as routes:
        return [line.split()[9] for line in routes
                if line.startswith("0" * 32 + " 00 ") and line.split()[9] != "lo"]
