"""A test host for network rows: as root, a network namespace of its own joined to this one by a
veth pair, with a TCP and a UDP server; rootless (no way to make one), servers on the host's own
non-loopback address instead (which answer `pong` to anyone, for the row's seconds). It
disappears with its servers.

Where the sandbox can have IPv6 (this host has an IPv6 default route, so pasta gives it some),
the test host serves the IPv6 forms of a guarded destination too: as root, a random ULA /64
on the veth, and on the namespace's loopback the NAT64 (64:ff9b::/96) and 6to4 (2002::/16)
forms of its IPv4 address, routed to it from here; rootless, the host's own global (or ULA)
address. The IPv4-mapped form of the IPv4 address reaches the IPv4 servers, and the host's own
link-local address on the interface pasta takes the sandbox's from (where it sends whatever
the sandbox sends to a link-local address) is served here too.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
from typing import TypeVar

from stockade.evidence.scene import NotRunnable
from stockade.evidence.servers import (
    DatagramServer,
    StreamServer,
    port_of,
    tcp_server,
    udp_port_bound,
    udp_server,
)
from stockade.evidence.watch import Finding, Watch

CLONE_NEWNET = 0x40000000
BENCHMARK_NET = "198.18"  # RFC 2544's range: no real host anywhere has these addresses
ULA = 0xFD << 120  # RFC 4193's fd00::/8: the test host's /64 gets a random global ID
NAT64 = 0x64FF9B << 96  # RFC 6052's well-known prefix 64:ff9b::/96: IPv4 in the last 32 bits
SIX_TO_FOUR = 0x2002 << 112  # RFC 3056's 2002::/16: IPv4 in the next 32 bits
SCOPE_GLOBAL, SCOPE_LINK = 0x00, 0x20  # /proc/net/if_inet6's scopes
UNUSABLE = 0x08 | 0x20 | 0x40  # its flags: duplicate detection failed, deprecated, tentative
S = TypeVar("S", StreamServer, DatagramServer)


class TestHost(Watch):
    """Servers answering on `address`: `tcp_port` (TCP, DNS over TCP), `udp_port` (UDP, DNS);
    with `forms6`, on the IPv6 forms this host can serve too: the attack's `targets6`
    (templates over the names in `values6`), `skipped6` saying which it cannot serve, and why."""

    def __init__(self, forms6: bool = False) -> None:
        self.link = ""
        self.servers: list[StreamServer | DatagramServer] = []
        self.values6: dict[str, str] = {}
        self.targets6: list[str] = []
        self.skipped6: list[str] = []
        from stockade.linux.net import default_links  # (POSIX-only: its rows run on Linux)

        ipv4, ipv6 = next(iter(default_links(4)), None), next(iter(default_links(6)), None)
        if not forms6:
            ipv6 = None
        if os.geteuid() == 0:
            self.address, self.label = self._namespace(ipv6), \
                "test host in its own network namespace"
        else:
            self.address, self.label = global_address(), "the host's own non-loopback address"
            self._serve()
            own6 = global_address6() if ipv6 else None
            if own6:
                self._serve6(own6, "test_own6")
            elif ipv6:
                self.skipped6.append("the host's own IPv6 address (it has no global or ULA one)")
        self.tcp_port, self.udp_port = port_of(self.tcp), port_of(self.udp)
        if forms6:
            self._more6(ipv4, ipv6)

    def _serve(self) -> None:
        self.tcp = self._add(tcp_server(self.address, f"{self.address} TCP server"))
        self.udp = self._add(udp_server(self.address, f"{self.address} UDP server"))

    def _add(self, server: S) -> S:
        self.servers.append(server)
        return server

    def _serve6(self, address: str, name: str) -> None:
        """IPv6 servers on `address` (the wildcard in the test host's namespace, where every
        address is the test host's), and TCP and UDP to `name`'s address as targets."""
        label = "IPv6" if address == "::" else f"[{address}]"
        tcp = self._add(tcp_server(address, f"{label} TCP server"))
        udp = self._add(udp_server(address, f"{label} UDP server"))
        self.values6.update(test_tcp6=str(port_of(tcp)), test_udp6=str(port_of(udp)))
        if address != "::":
            self.values6[name] = address
        self.targets6 += [f"tcp:[{{{name}}}]:{{test_tcp6}}", f"udp:[{{{name}}}]:{{test_udp6}}"]

    def _more6(self, ipv4: str | None, ipv6: str | None) -> None:
        """The IPv4-mapped form (IPv4 on the wire: the IPv4 servers answer it), and the host's
        own link-local address on `ipv6`, the interface of its IPv6 default route, where
        pasta sends what the sandbox sends to a link-local address (`ipv4`: IPv4's)."""
        self.values6["test_mapped"] = f"::ffff:{self.address}"
        self.targets6.append("tcp:[{test_mapped}]:{test_tcp}")
        if not ipv6:
            self.skipped6.append("IPv6 but the IPv4-mapped form (this host has no IPv6 "
                                 "default route: pasta gives the sandbox no IPv6)")
            return
        local = link_local(ipv6)
        if ipv4 not in (None, ipv6):  # (the target names the sandbox's interface as scope)
            self.skipped6.append(f"a link-local address (pasta names the sandbox's interface "
                                 f"after {ipv4}, but sends its IPv6 out of {ipv6})")
            return
        if local is None:
            self.skipped6.append(f"a link-local address ({ipv6} has none)")
            return
        server = self._add(tcp_server(f"{local}%{ipv6}", f"[{local}%{ipv6}] TCP server"))
        self.values6.update(test_link_local=f"{local}%{ipv6}", test_link_tcp=str(port_of(server)))
        self.targets6.append("tcp:[{test_link_local}]:{test_link_tcp}")

    def _namespace(self, ipv6: str | None) -> str:
        if not shutil.which("ip"):
            raise NotRunnable("the `ip` tool (iproute2) is not installed")
        tag = secrets.token_hex(3)
        self.link, inner = f"sev{tag}h", f"sev{tag}n"
        third, fourth = random.randrange(256), random.randrange(64) * 4
        outer_address = f"{BENCHMARK_NET}.{third}.{fourth + 1}"
        address = f"{BENCHMARK_NET}.{third}.{fourth + 2}"
        net6 = ipaddress.IPv6Network((ULA | secrets.randbits(56) << 64, 64))
        carried = int(ipaddress.IPv4Address(address))
        forms6 = {"test_ula": str(net6[2]),
                  "test_nat64": str(ipaddress.IPv6Address(NAT64 | carried)),
                  "test_6to4": str(ipaddress.IPv6Address(SIX_TO_FOUR | carried << 80 | 2))}
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
                commands = [f"addr add {address}/30 dev {inner}"]
                if ipv6:  # (nodad: usable at once, and nothing else is on this link)
                    commands += [f"addr add {net6[2]}/64 dev {inner} nodad",
                                 *(f"addr add {forms6[name]}/128 dev lo"
                                   for name in ("test_nat64", "test_6to4"))]
                for command in (*commands, f"link set {inner} up", "link set lo up"):
                    _ip(command)
                self.address = address
                self._serve()
                if ipv6:
                    self._serve6("::", "test_ula")
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
                if ipv6:
                    _ip(f"addr add {net6[1]}/64 dev {self.link} nodad")
                _ip(f"link set {self.link} up")
                for name in ("test_nat64", "test_6to4") if ipv6 else ():  # (gone with the veth)
                    _ip(f"-6 route add {forms6[name]}/128 via {net6[2]} dev {self.link}")
        except OSError as exc:
            failure.append(exc)
        finally:
            linked.set()
            done.wait(10)
        if failure or not tid:
            self.close()
            raise NotRunnable(f"cannot create a test network namespace: {failure[:1]}")
        if ipv6:
            self.values6.update(forms6)
            self.targets6 += ["tcp:[{test_nat64}]:{test_tcp6}", "tcp:[{test_6to4}]:{test_tcp6}"]
        return address

    def finish(self) -> Finding:
        findings = [server.finish() for server in self.servers]
        self.close()
        skipped = f"; not tried: {'; '.join(self.skipped6)}" if self.skipped6 else ""
        return Finding(all(f.ok for f in findings),
                       f"{self.label}: " + "; ".join(f.text for f in findings) + skipped)

    def close(self) -> None:
        for server in self.servers:
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
        self.link, self.servers, self.chosen, self.ports = "", [], chosen, ports
        self.seen: list[int] = []
        self.chosen_bound, self.knocks = False, 0
        self.stopped = threading.Event()
        self.knockers = [_udp(("127.0.0.1", 0)), _udp((global_address(), 0))]
        if os.geteuid() == 0:
            self.address, self.label = self._namespace(None), "knocking test host"
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


def global_address6() -> str | None:
    """The first global (or ULA) IPv6 address of this host, if it has one."""
    return next((address for address, scope, _ in _inet6() if scope == SCOPE_GLOBAL), None)


def link_local(link: str) -> str | None:
    """The link-local IPv6 address of the interface `link`, if it has one."""
    return next((address for address, scope, name in _inet6()
                 if scope == SCOPE_LINK and name == link), None)


def _inet6() -> list[tuple[str, int, str]]:
    """This host's usable IPv6 addresses: (address, scope, interface), from the kernel's list
    (ones still in or failed in duplicate detection, or deprecated, left out)."""
    found = []
    with open("/proc/net/if_inet6") as table:
        for line in table:
            raw, _, _, scope, flags, name = line.split()
            if not int(flags, 16) & UNUSABLE and name != "lo":
                found.append((str(ipaddress.IPv6Address(bytes.fromhex(raw))), int(scope, 16),
                              name))
    return found
