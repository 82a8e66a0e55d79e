"""User-mode networking for `network.mode = "any"`: pasta (Debian's `passt`, what rootless
Podman uses) joins the sandbox's own network namespace, gives it a tap interface with the
host's addresses and routes, and carries its TCP, UDP and ICMP echo out through ordinary
sockets of the host user. Nothing of the host's network is shared: the sandbox's loopback is
its own, and pasta is started with every port forwarding off (so no port bound on the host's
loopback appears on the sandbox's) and without its mapping of the gateway's address to the
host (so the gateway is the real router, not the host). The destination guard (guard.py) keeps
the rest of what the host could reach out of reach.

pasta joins the namespaces through descriptors pid 1 passes out (its own /proc/self/ns
entries: pid 1 is not dumpable, so no path of the host's /proc reaches them for another user's
process), and runs in the foreground as a child of this process, for as long as the sandbox:
the handle stops it when the sandbox settles, and the kernel kills it (parent-death signal)
if this process dies first. It is started by one long-lived thread, because the parent-death
signal follows the thread that forked, not the process.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

from stockade.errors import UnenforceableError
from stockade.launch.backend import Capability
from stockade.launch.request import LaunchRequest
from stockade.linux import dns, guard
from stockade.linux.fdpass import recv_fds
from stockade.linux.guard import TOOL_DIRS
from stockade.linux.net import routed_families
from stockade.linux.syscalls import prctl
from stockade.policy.reach import parse_reach

PR_SET_PDEATHSIG = 1
EPHEMERAL = (32768, 60999)  # the kernel's default ip_local_port_range
READY_TIMEOUT = 10.0  # seconds for pasta to configure the sandbox's interface
INSTALL = "install pasta and nftables (Debian and Ubuntu: apt install passt nftables)"


def pasta_path() -> str | None:
    return shutil.which("pasta", path=TOOL_DIRS)


def arguments(pasta: str, userns: int, netns: int, isolated: bool = True) -> list[str]:
    """pasta's command line for the namespaces at descriptors `userns` and `netns` (its own,
    inherited). Not `isolated` (tests only): pasta's defaults, which forward the host's
    loopback ports into the sandbox and map the gateway's address to the host."""
    argv = [pasta, "--quiet", "--foreground", "--config-net",
            "--userns", f"/proc/self/fd/{userns}", "--netns", f"/proc/self/fd/{netns}"]
    if isolated:
        argv += ["--no-map-gw", "--tcp-ports", "none", "--udp-ports", "none",
                 "--tcp-ns", "none", "--udp-ns", "none"]
    argv += ["--dns-forward", dns.FORWARD]
    if os.geteuid() == 0:  # (pasta would switch to nobody, who may not enter root's namespace)
        argv += ["--runas", "0"]
    return argv


def host_addresses() -> list[str]:
    """This host's own addresses, as its kernel lists them (IPv4 from the FIB's local
    entries, IPv6 from the interfaces)."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as trie:
            previous = ""
            for line in trie:
                words = line.split()
                if words[:1] == ["|--"] and len(words) > 1:
                    previous = words[1]
                elif "/32 host LOCAL" in line and previous:
                    found.add(previous)
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as interfaces:
            for line in interfaces:
                raw = line.split()[0]
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except (OSError, ValueError):
        pass
    return sorted(found)


def ephemeral_ports() -> tuple[int, int]:
    """The range this host's kernel picks client ports from (IPv4 and IPv6 alike)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        return EPHEMERAL
    return (low, high) if 1024 <= low <= high <= 65535 else EPHEMERAL


class Pasta:
    """One pasta process serving one sandbox's namespace."""

    def __init__(self, argv: list[str], fds: tuple[int, int]) -> None:
        self.process = _STARTER.start(argv, fds)

    def exited(self) -> str | None:
        """Why pasta ended (its own words), or None while it runs."""
        if self.process.poll() is None:
            return None
        err = self.process.stderr.read() if self.process.stderr else b""
        lines = [line for line in err.decode(errors="replace").splitlines()
                 if line.strip() and "syslog" not in line]
        return "; ".join(lines[-3:]) or f"pasta exited with status {self.process.returncode}"

    def stop(self) -> None:
        """Kill pasta and close its pipe now; the one reaper thread reaps it (its exit waits
        for the kernel to take the tap device down, tens of milliseconds the sandbox's
        settling need not wait). Once stopped, nothing of it is held: a thread or descriptor
        per stopped pasta, ending later, would make the owner's resources vary with timing."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process.stderr:
            self.process.stderr.close()
        _REAPER.reap(self.process)


class _Reaper:
    """The one long-lived thread that waits for every stopped pasta."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped: queue.SimpleQueue | None = None

    def reap(self, process: subprocess.Popen) -> None:
        with self._lock:
            if self._stopped is None:
                self._stopped = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._stopped,), daemon=True,
                                 name="stockade-pasta-reaper").start()
            self._stopped.put(process)

    @staticmethod
    def _serve(stopped: queue.SimpleQueue) -> None:
        while True:
            stopped.get().wait()


class _Starter:
    """The one thread that forks every pasta (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue | None = None

    def start(self, argv: list[str], fds: tuple[int, int]) -> subprocess.Popen:
        with self._lock:
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._requests,), daemon=True,
                                 name="stockade-pasta").start()
            requests = self._requests
        answer: queue.SimpleQueue = queue.SimpleQueue()
        requests.put((argv, fds, answer))
        result = answer.get()
        if isinstance(result, BaseException):
            raise result
        return result

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            argv, fds, answer = requests.get()
            try:
                answer.put(subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, pass_fds=fds, env={"PATH": TOOL_DIRS},
                    preexec_fn=_die_with_parent))  # noqa: PLW1509 - see the module docstring
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                answer.put(exc)


def _die_with_parent() -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


_STARTER = _Starter()
_REAPER = _Reaper()


def wait_ready(ready: Callable[[float], bool], pasta: Pasta,
               timeout: float = READY_TIMEOUT) -> str | None:
    """Wait until `ready(seconds)` (pid 1 saw its route out) or pasta ends: None when ready,
    else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready(0.05):
            return None
        why = pasta.exited()
        if why is not None:
            return f"pasta could not connect the sandbox: {why}"
    return f"pasta did not configure the sandbox's network within {timeout:.0f} s"


def diagnosis() -> tuple[str, str, tuple[str, ...]] | None:
    """Why this host cannot make network "any" — (cause code, summary, remedy) — or None."""
    tools = [name for name, path in (("pasta", pasta_path()), ("nft", guard.nft_path()))
             if path is None]
    if tools:
        return ("usernet_tools_missing", f"{' and '.join(tools)} not found: {INSTALL}",
                ("apt-get install passt nftables   # Debian, Ubuntu (Fedora: dnf install "
                 "passt nftables)",))
    if not routed_families():
        return ("no_default_route", "this host has no default route: there is nowhere to go",
                ("give the host a default route, or use network.mode = \"none\"",))
    lost = dns.lost(dns.read_host())
    if lost:
        return ("resolver_on_loopback", f"the host's only DNS resolvers are IPv6 ones on its "
                f"loopback ({lost[0]}, /etc/resolv.conf), which pasta cannot relay to: name "
                'an IPv4 or outside resolver there, or use network.mode = "allowlist"',
                ("add a line `nameserver 127.0.0.1` (or your network's resolver) to "
                 "/etc/resolv.conf, with the local resolver listening on it",))
    return None


def missing() -> str | None:
    """Why this host cannot make network "any" (a tool, a route, a resolver), or None."""
    found = diagnosis()
    return None if found is None else found[1]


def check(request: LaunchRequest) -> None:
    """Refuse network "any" where this host cannot make it (typed, with the remedy)."""
    why = missing()
    if why is not None:
        raise UnenforceableError("network.any", why)
    own = own_in_reach(request.network.reach, host_addresses())
    if own:
        raise UnenforceableError(
            "network.reach", f"{own[0]} lists this host's own address {own[1]}, which in the "
            "sandbox is its own (pasta gives it the host's address): a host service is reached "
            'through the proxy: network.mode = "allowlist" with allow = ["ADDRESS:PORT"]')


def own_in_reach(reach: Iterable[str], host: Iterable[str]) -> tuple[str, str] | None:
    """The first `network.reach` entry that names one of the host's own addresses `host` alone,
    and that address; None if none does. (A range holding one is accepted: the guard keeps
    the host's own addresses refused within it, guard.ruleset.)"""
    own = set(guard.own_addresses(host))
    for entry in reach:
        network = parse_reach(entry).network
        if network.num_addresses == 1 and network.network_address in own:
            return entry, str(network.network_address)
    return None


def capability() -> Capability:
    why = missing()
    if why is not None:
        return Capability("network.any", False, why)
    return Capability("network.any", True, "own network namespace; pasta (user-mode) out, "
                      "an nftables destination guard inside",
                      "loopback, link-local, metadata, private and the host's own addresses "
                      "refused unless network.reach lists them")


class WayOut:
    """The owner's side of one sandbox's network "any": pasta, and the guard's log."""

    def __init__(self, request_id: str, log: socket.socket, pasta: Pasta) -> None:
        self.request_id = request_id
        self.log = log
        self.pasta = pasta
        self._denials: list[dict] = []
        self.dropped = 0  # refusals the guard counted but logged no record of

    @classmethod
    def open(cls, request: LaunchRequest, control: socket.socket,
             weaken: frozenset[str]) -> WayOut | None:
        """Send pid 1 the guard (net.open_out), start pasta on the namespaces it passes out,
        and wait until its route out exists. None when pid 1 failed first (its error event
        says why); when pasta fails, pid 1 is told why and fails with it."""
        host = dns.read_host()
        servers = dns.sandbox_servers(host)
        text = guard.ruleset(host_addresses(), [a for a in servers if a != dns.FORWARD],
                             request.network.reach, guarded="address_guard" not in weaken,
                             relay=dns.FORWARD if dns.FORWARD in servers else None,
                             inbound="inbound_guard" not in weaken,
                             ports=None if "source_ports" in weaken else ephemeral_ports())
        spec = json.dumps({"nft": guard.nft_path(), "ruleset": text,
                           "families": sorted(routed_families()),
                           "resolv_conf": dns.sandbox_conf(host)}).encode()
        try:
            control.sendall(struct.pack("<I", len(spec)) + spec)
            _, fds = recv_fds(control, 3)
        except OSError:
            return None
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return None
        log = socket.socket(fileno=fds[0])
        try:
            pasta = Pasta(arguments(pasta_path() or "pasta", fds[1], fds[2],
                                    isolated="usernet_isolation" not in weaken),
                          (fds[1], fds[2]))
        except OSError as exc:
            log.close()
            _tell(control, f"pasta could not start: {exc.strerror or exc}")
            return None
        finally:
            os.close(fds[1])
            os.close(fds[2])
        way_out = cls(request.request_id, log, pasta)

        def ready(seconds: float) -> bool:
            return bool(select.select([control], [], [], seconds)[0])
        why = wait_ready(ready, pasta)
        if why is not None:
            _tell(control, why)
        return way_out

    def denials(self) -> list[dict]:
        if self.log.fileno() >= 0:
            self._denials += guard.records(self.log, self.request_id)
        return list(self._denials)

    def close(self) -> None:
        """Stop pasta, read the last records, and count the refusals the log dropped (the
        rate limit, a full socket buffer): the guard counted each. A count that cannot be
        read drops nothing said."""
        self.pasta.stop()
        self.denials()
        if self.log.fileno() >= 0:
            count, more = guard.refused(self.log, self.request_id)
            self._denials += more
            self._denials += guard.records(self.log, self.request_id)
            if count is not None:
                self.dropped = max(0, count - len(self._denials))
        self.log.close()


def _tell(control: socket.socket, why: str) -> None:
    try:
        control.send(why.encode()[:4000])
    except OSError:
        pass
