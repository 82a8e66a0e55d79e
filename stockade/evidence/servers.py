"""Host-side network watches: servers on the host that answer every contact (so an escaped child
would get a reply) and count contacts, a prober that tries to reach a port the child listens on,
a socket left inheritable by the launching process, and Stockade's own daemon.
"""

from __future__ import annotations

import abc
import errno
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from stockade.evidence.scene import NotRunnable
from stockade.evidence.watch import Finding, Watch


class _Server(Watch):
    """A server on the host that answers every contact with `pong` and counts contacts."""

    kind = ""

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.sock, self.label = sock, label
        self.contacts = 0
        self.stopped = threading.Event()
        sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self._answer()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                if not self.stopped.is_set():
                    time.sleep(0.05)

    @abc.abstractmethod
    def _answer(self) -> None:
        """Answer (and count) one contact, or raise TimeoutError when there is none."""

    def finish(self) -> Finding:
        self.close()
        if self.contacts:
            return Finding(False, f"{self.label} was CONTACTED {self.contacts} time(s)")
        return Finding(True, f"{self.label} got no contact")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.sock.close()


class StreamServer(_Server):
    """A listening stream socket (TCP or unix)."""

    def __init__(self, sock: socket.socket, label: str) -> None:
        sock.listen(8)
        super().__init__(sock, label)

    def _answer(self) -> None:
        conn, _ = self.sock.accept()
        self.contacts += 1
        with conn:
            conn.settimeout(1)
            try:
                conn.recv(512)
                conn.sendall(b"pong")
            except OSError:
                pass


class DatagramServer(_Server):
    """A UDP socket answering each datagram."""

    def _answer(self) -> None:
        _, peer = self.sock.recvfrom(512)
        self.contacts += 1
        self.sock.sendto(b"pong", peer)


def tcp_server(host: str, label: str) -> StreamServer:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(socket_address(host, 0))
    return StreamServer(sock, label)


def udp_server(host: str, label: str, port: int = 0) -> DatagramServer:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind(socket_address(host, port))
    return DatagramServer(sock, label)


def socket_address(host: str, port: int) -> tuple:
    """(host, port); for an IPv6 address with a zone (fe80::1%eth0), the scope id the kernel
    needs, which Python does not take from the text."""
    address, _, zone = host.partition("%")
    return (address, port, 0, socket.if_nametoindex(zone)) if zone else (host, port)


def unix_server(address: str, label: str) -> StreamServer:
    """`address` is a path, or an abstract name starting with NUL."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address)
    return StreamServer(sock, label)


def port_of(server: _Server) -> int:
    return server.sock.getsockname()[1]


class Prober(Watch):
    """Keeps trying to connect to a TCP port on the host's loopback while the attack runs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connected = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(0.1):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                self.connected += 1
            except OSError:
                continue

    def finish(self) -> Finding:
        self.close()
        if self.connected:
            return Finding(False, f"the host CONNECTED to the sandbox's port {self.connected} "
                                  "time(s)")
        return Finding(True, f"the host could not connect to port {self.port}")

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


def udp_port_bound(port: int) -> bool:
    """Whether a UDP socket of this network namespace is bound to `port` (any address)."""
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as f:
                rows = list(f)[1:]
        except OSError:
            continue
        if any(int(row.split()[1].rpartition(":")[2], 16) == port for row in rows):
            return True
    return False


class InheritedSocket(Watch):
    """A connected socket pair whose one end is left inheritable in this process: nothing may
    arrive at the other end."""

    def __init__(self) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.fd = self.theirs.fileno()
        os.set_inheritable(self.fd, True)
        self.ours.setblocking(False)

    def finish(self) -> Finding:
        try:
            received = self.ours.recv(512)
        except BlockingIOError:
            received = b""
        self.close()
        if received:
            return Finding(False, f"the inherited socket CARRIED {received!r}")
        return Finding(True, f"socket left inheritable (fd {self.fd}) carried nothing")

    def close(self) -> None:
        self.ours.close()
        self.theirs.close()


class StockadeDaemon(Watch):
    """A real `stockade daemon` (with its CLI server) whose state directory is `state`, as for a
    command started from the directory that holds it; ended at `finish`."""

    def __init__(self, state: str, package_parent: str) -> None:
        env = {**os.environ, "STOCKADE_STATE_DIR": state, "PYTHONPATH": package_parent}
        self.process = subprocess.Popen([sys.executable, "-m", "stockade", "daemon"], env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self.sockets = [os.path.join(state, name) for name in ("cli.sock", "daemon.sock")]
        deadline = time.monotonic() + 60
        from stockade.linux import servercheck  # (POSIX-only: its rows run on Linux)

        while not all(servercheck.answers(path) for path in self.sockets):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise NotRunnable("stockade daemon did not start here")
            time.sleep(0.1)

    def finish(self) -> Finding:
        alive = self.process.poll() is None
        self.close()
        return Finding(alive, "the daemon served on" if alive else "the daemon DIED")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class StandInDialer:
    """The allowlist proxy's connections, for rows whose stand-in DNS answers an address no
    test may reach (the cloud metadata endpoint): each such (address, port) is reached at a
    server of the scene's (`reach`), loopback as itself, anything else not at all."""

    def __init__(self, reach: Mapping[tuple[str, int], tuple[str, int]]) -> None:
        self.reach = dict(reach)

    def __call__(self, candidates: Sequence[str], port: int, timeout: float,
                 on_socket: Callable[[socket.socket], None]) -> socket.socket:
        from stockade.net.gate import dial

        targets = [self.reach[(text, port)] if (text, port) in self.reach else (text, port)
                   for text in candidates
                   if (text, port) in self.reach or ipaddress.ip_address(text).is_loopback]
        if not targets:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "the evidence dials only loopback")
        failure: OSError = OSError("no address to dial")
        for host, target_port in targets:
            try:
                return dial([host], target_port, timeout, on_socket)
            except OSError as exc:
                failure = exc
        raise failure
