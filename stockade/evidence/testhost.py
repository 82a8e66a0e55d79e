"""A test host for network rows: as root, a network namespace of its own joined to this one by a
veth pair, with a TCP and a UDP server; rootless (no way to make one), servers on the host's own
non-loopback address instead. Either way, nothing it serves is reachable from outside this
machine, and it disappears with its servers.
"""

from __future__ import annotations

import ctypes
import os
import random
import secrets
import shutil
import socket
import subprocess
import threading

from stockade.evidence.scene import NotRunnable
from stockade.evidence.servers import port_of, tcp_server, udp_port_bound, udp_server
from stockade.evidence.watch import Finding, Watch

CLONE_NEWNET = 0x40000000
BENCHMARK_NET = "198.18"  # RFC 2544's range: no real host anywhere has these addresses


class TestHost(Watch):
    """Servers answering on `address`: `tcp_port` (TCP, DNS over TCP), `udp_port` (UDP, DNS)."""

    def __init__(self) -> None:
        self.link = ""
        if os.geteuid() == 0:
            self.address, self.label = self._namespace(), "test host in its own network namespace"
        else:
            self.address, self.label = global_address(), "the host's own non-loopback address"
            self._serve()
        self.tcp_port, self.udp_port = port_of(self.tcp), port_of(self.udp)

    def _serve(self) -> None:
        self.tcp = tcp_server(self.address, f"{self.address} TCP server")
        self.udp = udp_server(self.address, f"{self.address} UDP server")

    def _namespace(self) -> str:
        if not shutil.which("ip"):
            raise NotRunnable("the `ip` tool (iproute2) is not installed")
        tag = secrets.token_hex(3)
        self.link, inner = f"sev{tag}h", f"sev{tag}n"
        third, fourth = random.randrange(256), random.randrange(64) * 4
        outer_address = f"{BENCHMARK_NET}.{third}.{fourth + 1}"
        address = f"{BENCHMARK_NET}.{third}.{fourth + 2}"
        entered, linked, done = threading.Event(), threading.Event(), threading.Event()
        failure: list[BaseException] = []
        tid: list[int] = []

        def inside() -> None:  # this thread alone moves into the new namespace
            try:
                if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
                tid.append(threading.get_native_id())
                entered.set()
                linked.wait(10)
                for command in (f"addr add {address}/30 dev {inner}", f"link set {inner} up",
                                "link set lo up"):
                    _ip(command)
                self.address = address
                self._serve()
            except BaseException as exc:  # reported to the creating thread
                failure.append(exc)
            finally:
                entered.set()
                done.set()

        threading.Thread(target=inside, daemon=True).start()
        entered.wait(10)
        try:
            if tid:
                _ip(f"link add {self.link} type veth peer name {inner} netns {tid[0]}")
                _ip(f"addr add {outer_address}/30 dev {self.link}")
                _ip(f"link set {self.link} up")
        except OSError as exc:
            failure.append(exc)
        finally:
            linked.set()
            done.wait(10)
        if failure or not tid:
            self.close()
            raise NotRunnable(f"cannot create a test network namespace: {failure[:1]}")
        return address

    def finish(self) -> Finding:
        findings = [self.tcp.finish(), self.udp.finish()]
        self.close()
        return Finding(all(f.ok for f in findings),
                       f"{self.label}: " + "; ".join(f.text for f in findings))

    def close(self) -> None:
        for server in (getattr(self, "tcp", None), getattr(self, "udp", None)):
            if server is not None:
                server.close()
        if self.link:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True, check=False)
            self.link = ""


class KnockingHost(TestHost):
    """A test host in a namespace of its own (rootless, where none can be made, the host's own
    address, which a sandbox in network any cannot reach: its rows are root-only) that
    answers each UDP datagram with the address and port it came from (as a STUN server does:
    for a sandbox in network any, the host port pasta sent it from), then knocks there
    unsolicited from the host's loopback, the host's own address and its own address
    (another port), while the attack listens. The host's side: the port the attack chose
    (`chosen`) must not be bound on the host, and every port pasta used lies in `ports` (the
    host's ephemeral range)."""

    ROUNDS, PAUSE = 10, 0.3  # knocks at each port, and the pause between them

    def __init__(self, chosen: int, ports: tuple[int, int]) -> None:
        self.link, self.chosen, self.ports = "", chosen, ports
        self.seen: list[int] = []
        self.chosen_bound, self.knocks = False, 0
        self.stopped = threading.Event()
        self.knockers = [_udp(("127.0.0.1", 0)), _udp((global_address(), 0))]
        if os.geteuid() == 0:
            self.address, self.label = self._namespace(), "knocking test host"
        else:
            self.address, self.label = global_address(), "knocking host address"
            self._serve()
        self.port = self.reflector.getsockname()[1]
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _serve(self) -> None:  # (in the namespace: its sockets are the test host's)
        self.reflector = _udp((self.address, 0))
        self.reflector.settimeout(0.1)
        self.knockers.append(_udp((self.address, 0)))

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                _, peer = self.reflector.recvfrom(512)
            except OSError:
                continue
            self.chosen_bound |= udp_port_bound(self.chosen)
            self.seen.append(peer[1])
            self.reflector.sendto(f"{peer[0]}:{peer[1]}".encode(), peer)
            threading.Thread(target=self._knock, args=(peer,), daemon=True).start()

    def _knock(self, peer: tuple[str, int]) -> None:
        for _ in range(self.ROUNDS):
            if self.stopped.wait(self.PAUSE):
                return
            for knocker in self.knockers:
                source = knocker.getsockname()[0]
                target = (peer[0] if source == self.address else source, peer[1])
                try:
                    knocker.sendto(f"unsolicited from {source}".encode(), target)
                    self.knocks += 1
                except OSError:
                    pass

    def finish(self) -> Finding:
        self.close()
        outside = [port for port in self.seen if not self.ports[0] <= port <= self.ports[1]]
        if self.chosen_bound:
            return Finding(False, f"the attack's own port {self.chosen} was BOUND on the host")
        if outside:
            return Finding(False, f"datagrams came from host ports {outside}, OUTSIDE the "
                                  f"ephemeral range {self.ports[0]}-{self.ports[1]}")
        return Finding(True, f"{self.label} {self.address}: {self.knocks} unsolicited "
                             f"datagrams sent to host ports {sorted(set(self.seen))}; port "
                             f"{self.chosen} not bound on the host")

    def close(self) -> None:
        self.stopped.set()
        if getattr(self, "thread", None) is not None:
            self.thread.join()
        for sock in [*self.knockers, getattr(self, "reflector", None)]:
            if sock is not None:
                sock.close()
        super().close()


def _udp(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(address)
    return sock


def _ip(command: str) -> None:
    done = subprocess.run(["ip", *command.split()], capture_output=True, text=True, check=False)
    if done.returncode:
        raise OSError(f"ip {command}: {done.stderr.strip()}")


def global_address() -> str:
    """The first global IPv4 address of this host."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                          capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        return line.split()[3].split("/")[0]
    raise NotRunnable("this host has no global IPv4 address to stand in for a test host")

