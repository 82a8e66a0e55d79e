"""A kept Windows Sandbox guest serves a later execution only if everything it fixed at its boot
is that execution's too (attack round on issue 36, W2): its proxy is made once, from the
booting execution's allow/deny, so they are part of the guest's shape. The host's address on
the sandbox's switch, where the proxy binds, is stood for by loopback; the daemon, the plan,
the proxy and its rules are the real ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.vm import wsb, wsb_daemon, wsb_plan
from stockade.vm import wsb_rendezvous as rz

BOOT_DIR = "C:\\Users\\me\\state\\wsb\\b\\boot"
RENDEZVOUS_DIR = "C:\\Users\\me\\state\\wsb\\b\\rendezvous"
VIEW = wsb_plan.HostView(lambda path: None, lambda root, names: [])


def grants(*paths: str) -> tuple[PathGrant, ...]:
    return tuple(PathGrant(p, p) for p in paths)


def agent(allow: tuple[str, ...], deny: tuple[str, ...] = ()) -> LaunchRequest:
    return LaunchRequest(argv=("C:\\Python312\\python.exe",), cwd="C:\\ws", env=(),
                         read=grants("C:\\Python312", "C:\\src\\stockade"),
                         write=grants("C:\\ws"), exec_from_write=True,
                         limits=LimitSpec(memory=4 << 30, pids=512),
                         network=NetworkSpec("allowlist", allow, deny))


def planned(request: LaunchRequest) -> wsb_plan.Plan:
    """The guest's plan, over a host view of this test's own (no folders to mask or freeze)."""
    return wsb_plan.plan(request, boot_dir=BOOT_DIR, rendezvous_dir=RENDEZVOUS_DIR,
                         boot_id="0" * 32, view=VIEW,
                         proxy_port=wsb.PLACEHOLDER_PORT
                         if request.network.mode == "allowlist" else None)


def shape(request: LaunchRequest) -> tuple:
    return planned(request).shape()


class Guest:
    """A booted guest as WsbGuest is once attached: its request, shape, and the proxy the
    real serve_proxy made for it from that request."""

    def __init__(self, request: LaunchRequest) -> None:
        self.request, self.plan, self.pid = request, planned(request), 1
        self.shape = self.plan.shape()
        record = rz.Ready("0" * 32, rz.TCP, "0" * 64, "172.20.1.2", 47470, "172.20.1.1")
        self.proxy = None
        self.session = object()
        self.running = True
        self._record = record

    def attach(self, timeout: float) -> None:
        self.proxy = wsb.serve_proxy(self.request, self._record, 0)

    def alive(self) -> bool:
        return self.running

    def stop(self) -> bool:
        if self.proxy is not None:
            self.proxy.stop()
        self.running = False
        return True


@pytest.fixture
def switch(monkeypatch):
    bind = wsb.GuestOnly.bind
    monkeypatch.setattr(wsb.GuestOnly, "bind", lambda self, address: bind(self, ("127.0.0.1", 0)))


@pytest.mark.parametrize("first,second,host", [
    (agent(("pypi.org", "*.githubusercontent.com")), agent(("pypi.org",)),
     "raw.githubusercontent.com"),
    (agent(("*.example.com",)), agent(("*.example.com",), deny=("secret.example.com",)),
     "secret.example.com"),
])
def test_a_kept_guest_is_not_reused_by_an_execution_with_another_allowlist(
        switch, first, second, host):
    assert shape(first) != shape(second)
    daemon = wsb_daemon.Daemon(Guest, shape)
    try:
        kept = daemon.acquire(first)
        daemon.release(kept, reuse=True)  # (its command ended normally: the guest is kept)
        lease = daemon.acquire(second)
        assert lease.guest is not kept.guest
        assert not lease.guest.proxy.gate.rules.decide(host, 443).allowed
        daemon.release(lease, reuse=True)
        assert daemon.acquire(second).guest is lease.guest  # (the same policy reuses it)
    finally:
        daemon.close()


@pytest.mark.parametrize("mode,kept", [("none", False), ("allowlist", True)])
def test_a_guest_without_a_network_is_never_kept(switch, mode, kept):
    """Attack round on issue 36, W3/W4: a `none` guest's channel is its session's whole log
    (the spool) in a folder its commands may reach: a later execution in the kept guest read
    the earlier one's environment, stdin, output and hello nonce, and could append frames.
    Such a guest is stopped after its execution; the next boots its own (fresh spool)."""
    request = replace(agent(("pypi.org",)), network=NetworkSpec(mode, ("pypi.org",)
                                                                if mode == "allowlist" else ()))
    daemon = wsb_daemon.Daemon(Guest, shape)
    try:
        first = daemon.acquire(request)
        wsb.LeaseHandle(daemon, first).release(reuse=True)
        assert (daemon.acquire(request).guest is first.guest) == kept
        assert first.guest.running == kept
    finally:
        daemon.close()
