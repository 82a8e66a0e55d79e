"""The egress fence on a real Windows host, with the service installed (`stockade fence
install`, elevated): not collected with the suite (no `test_` prefix); scripts/windows_ci.py
runs it by name, `fence` for the allowlist rows and `network-any` for `any`, in the workflow's
jobs of those names. Real children in the real sandbox try each forbidden thing next to a
control showing the permitted one works, and what the fence changed is checked gone after."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import replace

import pytest
from test_windows_enforcement import request, ws  # noqa: F401 -- the fixture, and requests

import stockade
from stockade.launch.backend import Stdio
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.request import NetworkSpec

pytestmark = pytest.mark.windows

CHILD = r"""
import json, os, socket, sys
def tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((host, port))
        return "ok"
    except OSError:
        return "refused"
    finally:
        s.close()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(b"x", (host, port))
        return "ok" if s.recv(8) else "refused"
    except OSError:
        return "refused"
    finally:
        s.close()
def proxied(target):
    port = int(os.environ["HTTP_PROXY"].rpartition(":")[2])
    try:
        with socket.create_connection(("127.0.0.1", port), 5) as s:
            s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            return s.recv(64).split(b" ")[1].decode()
    except OSError:
        return "refused"
tries = json.loads(sys.argv[1])
print(json.dumps({name: globals()[kind](*args) for name, (kind, *args) in tries.items()}))
"""


@contextlib.contextmanager
def servers():
    """A TCP listener on 127.0.0.1, one on every IPv4 address, one on ::1 and a UDP echo on
    127.0.0.1; their ports."""
    made = {"tcp": socket.create_server(("127.0.0.1", 0)),
            "any": socket.create_server(("0.0.0.0", 0)),
            "v6": socket.create_server(("::1", 0), family=socket.AF_INET6),
            "udp": socket.socket(socket.AF_INET, socket.SOCK_DGRAM)}
    made["udp"].bind(("127.0.0.1", 0))
    stop = threading.Event()

    def accept(server: socket.socket) -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                conn.close()

    def echo() -> None:
        made["udp"].settimeout(0.5)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                data, peer = made["udp"].recvfrom(8)
                made["udp"].sendto(data, peer)

    threads = [threading.Thread(target=accept, args=(made[n],), daemon=True)
               for n in ("tcp", "any", "v6")] + [threading.Thread(target=echo, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        yield {name: sock.getsockname()[1] for name, sock in made.items()}
    finally:
        stop.set()
        for sock in made.values():
            sock.close()


def host_address() -> str:
    """One of this host's own IPv4 addresses that is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # (no packet: it only picks the route's source)
        return probe.getsockname()[0]


def compiled_allowlist(workspace: str, allowed: str):
    """An allowlist request whose network and environment come from compile (its proxy
    variables are what every real launch gets: a case-duplicate there refuses them all)."""
    policy = stockade.preset("workspace-write")
    policy = replace(policy, network=replace(policy.network, mode="allowlist", allow=(allowed,)))
    compiled = compile_policy(policy, ["python"], CompileContext.current(workspace))
    base = request(workspace, "")
    own = {name.upper() for name, _ in base.env}
    env = base.env + tuple(pair for pair in compiled.env if pair[0].upper() not in own)
    return replace(base, env=env, network=compiled.network)


def launched(req, tries: dict) -> tuple[dict, list]:
    """What the child found, and the proxy's denials."""
    from stockade.windows.backend import WindowsBackend

    req = replace(req, argv=(*req.argv[:4], CHILD, json.dumps(tries)))
    handle = WindowsBackend().spawn(req, Stdio(subprocess.DEVNULL, subprocess.PIPE,
                                               subprocess.PIPE))
    out = handle.stdout.read()
    err = handle.stderr.read()
    end = handle.wait(120)
    assert end is not None and end.failure is None and end.exit_code == 0, err
    return json.loads(out), handle.network_log


def fence_state() -> tuple[list[str], list[str]]:
    """The service's ledger records and the loopback exemptions of Stockade profiles."""
    from stockade.windows import fenceinstall, wfpengine

    records = os.path.join(fenceinstall.STATE, "records")
    listed = sorted(os.listdir(records)) if os.path.isdir(records) else []
    firewall = wfpengine.WfpFirewall()
    try:
        return listed, firewall.exemptions()
    finally:
        firewall.close()


def test_an_allowlist_sandbox_reaches_the_proxy_and_nothing_else_on_the_host(ws):  # noqa: F811
    workspace, _ = ws
    before = fence_state()
    with servers() as ports:
        allowed = f"127.0.0.1:{ports['tcp']}"
        req = compiled_allowlist(workspace, allowed)
        seen, denials = launched(req, {
            "proxy_allowed": ["proxied", allowed],
            "proxy_denied": ["proxied", "evil.example.net:443"],
            "direct_loopback": ["tcp", "127.0.0.1", ports["tcp"]],
            "direct_host_address": ["tcp", host_address(), ports["any"]],
            "ipv6_loopback": ["tcp", "::1", ports["v6"]],
            "udp_loopback": ["udp", "127.0.0.1", ports["udp"]],
        })
    assert seen == {"proxy_allowed": "200", "proxy_denied": "403",
                    "direct_loopback": "refused", "direct_host_address": "refused",
                    "ipv6_loopback": "refused", "udp_loopback": "refused"}
    assert [d["host"] for d in denials] == ["evil.example.net"]
    assert fence_state() == before  # no record left, no exemption left


def test_an_any_sandbox_reaches_the_internet_but_not_the_guarded_ranges(ws):  # noqa: F811
    workspace, _ = ws
    before = fence_state()
    with servers() as ports:
        req = replace(request(workspace, ""), network=NetworkSpec("any"))
        seen, _ = launched(req, {
            "public": ["tcp", "1.1.1.1", 443],
            "metadata": ["tcp", "169.254.169.254", 80],
            "azure_wire_server": ["tcp", "168.63.129.16", 80],
            "loopback": ["tcp", "127.0.0.1", ports["tcp"]],
            "host_address": ["tcp", host_address(), ports["any"]],
            "ipv6_loopback": ["tcp", "::1", ports["v6"]],
        })
    assert seen == {"public": "ok", "metadata": "refused", "azure_wire_server": "refused",
                    "loopback": "refused", "host_address": "refused",
                    "ipv6_loopback": "refused"}
    assert fence_state() == before


def service_pid() -> int:
    shown = subprocess.run(["sc.exe", "queryex", "StockadeFence"], capture_output=True,
                           text=True, check=True).stdout
    return int(next(line for line in shown.splitlines() if "PID" in line).split(":")[1])


def test_a_crashed_service_takes_back_what_it_recorded_when_it_restarts(ws):  # noqa: F811
    from stockade.windows import fenceclient
    from stockade.windows.backend import WindowsBackend

    workspace, _ = ws
    before = fence_state()
    req = replace(request(workspace, "import time; time.sleep(20)"),
                  network=NetworkSpec("allowlist", ("example.com",)))
    handle = WindowsBackend().spawn(req, Stdio(subprocess.DEVNULL, subprocess.DEVNULL,
                                               subprocess.DEVNULL))
    assert fence_state()[0] != before[0]  # the fence's record, while it runs
    subprocess.run(["taskkill", "/F", "/PID", str(service_pid())], check=True)
    handle.wait(60)
    deadline = time.monotonic() + 120  # the service manager restarts it (5 s), it reconciles
    while (fenceclient.helper_refusal() or fence_state() != before) \
            and time.monotonic() < deadline:
        time.sleep(2)
    assert fence_state() == before
