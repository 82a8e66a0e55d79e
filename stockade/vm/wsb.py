"""`WindowsSandbox` and the `windows-sandbox` backend: commands in a Windows Sandbox guest
(docs/windows-sandbox.md), with the same `run`/`stream`/`ping`/`close` and the same protocol as
the Linux session and the QEMU driver, spoken to the guest's own agent (wsb_agent): over a TCP
connection across the sandbox's virtual switch (`allowlist`), or over the spool in the
rendezvous folder (`none`: the guest has no network at all).

The process's daemon (wsb_daemon) keeps its one guest: an execution of the backend borrows it
(booting one when none fits) and hands it back for the next; a warm `WindowsSandbox` always
gets a fresh guest of its own, stopped when it closes.

A guest (`WsbGuest`): compile the agent's request; plan it (wsb_plan: refusals first); find the
launcher; take the host's lease (wsb_lock: `busy`); write the per-boot folders (the bootstrap,
the guest entry and the masks, read-only in the guest; the secret and, without a network, the
spool, in the read-write rendezvous folder); start the sandbox. Then `attach`: wait for the
rendezvous and check its proof; over TCP connect and check the agent's answer to a challenge;
greet the agent; with `allowlist`, serve Stockade's proxy on the host's address the guest named
(its gateway), at the port the plan opened in the guest's firewall, to the guest's address only.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hmac
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from stockade.errors import SetupError, UnavailableError, UnenforceableError
from stockade.launch import registry
from stockade.launch.compile import CompileContext
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.lifecycle import lease, statedir
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.net.env import proxy_environment, with_proxy
from stockade.net.proxy import Proxy
from stockade.policy import Policy
from stockade.session import boot
from stockade.session.channel import FramedChannel
from stockade.session.errors import SessionError
from stockade.session.exchange import Ending
from stockade.session.guest import GuestBackend
from stockade.session.sandbox import Sandbox
from stockade.vm import (
    wsb_bootstrap,
    wsb_config,
    wsb_daemon,
    wsb_launcher,
    wsb_ledger,
    wsb_lock,
    wsb_plan,
)
from stockade.vm import wsb_rendezvous as rz
from stockade.vm.wsb_channel import SocketChannel
from stockade.vm.wsb_spool import SpoolChannel, create

BACKEND = "windows-sandbox"
CONNECT_TIMEOUT = 10.0  # seconds for the TCP connection and the agent's answer
POLL = 0.5  # seconds between looks at the rendezvous folder
START_TIMEOUT = 120.0  # seconds `wsb start` / `wsb stop` may take
STOP_TIMEOUT = 30.0  # seconds WindowsSandbox.exe may take to end once told to
CONFIG_FILE = "sandbox.wsb"
PLACEHOLDER_PORT = 3128  # (a plan made only to check or compare needs some proxy port)


class WsbGuest:
    """One Windows Sandbox this process started (wsb_daemon.Guest). Stopping it runs `wsb stop`
    or ends WindowsSandbox.exe (the process it started, never one found by name); once the VM
    is gone it drops the host's lease and removes the per-boot folders."""

    def __init__(self, request: LaunchRequest, plan: wsb_plan.Plan,
                 launcher: wsb_launcher.Launcher, workdir: str) -> None:
        self.request, self.plan, self.launcher, self.workdir = request, plan, launcher, workdir
        self.shape = plan.shape()
        self.sandbox_id = wsb_ledger.sandbox_id(plan.boot_id)
        self.process: subprocess.Popen | None = None
        self.proxy: Proxy | None = None
        self.proxy_address: tuple[str, int] | None = None
        self.session: boot.Session | None = None  # type: ignore[assignment]
        self.record: LaunchRecord | None = None  # (the ledger's, from `start`: wsb_ledger)
        self._lock: wsb_lock.HostLock | None = None
        self._secret = b""
        self._stopped = self._gone = False

    @property
    def pid(self) -> int:
        return 0 if self.process is None else self.process.pid

    def start(self) -> None:
        """Take the lease, write the per-boot folders, start the sandbox, recorded in the
        ledger before the boot is waited for (wsb_ledger)."""
        self._lock = wsb_lock.acquire(wsb_lock.default_path())
        self._secret = secrets.token_bytes(rz.SECRET_SIZE)
        record = self.record = LaunchRecord(Ledger(), f"wsb-{self.plan.boot_id}")
        try:
            config = wsb_config.render(self.plan)
            _prepare(self.workdir, self.plan, guest_python(), self._secret, config)
            argv = self.launcher.start(self.sandbox_id, config,
                                       os.path.join(self.workdir, CONFIG_FILE))
            if self.launcher.kind == wsb_launcher.PROGRAM:
                self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)
                record.add(wsb_ledger.KIND, self.plan.boot_id,
                           wsb_ledger.started(self.process.pid))
            else:
                record.add(wsb_ledger.KIND, self.plan.boot_id, wsb_ledger.BY_ID)
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=START_TIMEOUT, check=False)
                if done.returncode != 0:
                    tail = done.stderr[-300:].decode("utf-8", "replace").strip()
                    raise SetupError("windows_sandbox_start_failed",
                                     f"wsb start exited with {done.returncode}: {tail}",
                                     "launch")
        except BaseException:
            if self.process is not None:
                self.process.kill()  # (this process's own, recorded or not)
            self._lock.release()
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._stopped = self._gone = True
            record.settle(strict=False)  # (what it cannot end, a later reconcile does)
            raise

    def attach(self, timeout: float) -> None:
        """The rendezvous, the agent's hello, and (allowlist) the proxy."""
        rendezvous = os.path.join(self.workdir, "rendezvous")
        channel, hello, record = attach(rendezvous, self._secret, self.plan.boot_id, timeout,
                                        self.alive, networking=self.plan.networking)
        self.session = boot.Session(self.request, self, channel, hello)  # type: ignore[arg-type]
        if self.plan.network == "allowlist":
            assert self.plan.proxy_port is not None
            self.proxy = serve_proxy(self.request, record, self.plan.proxy_port)
            self.proxy_address = (record.host, self.plan.proxy_port)

    def alive(self) -> bool:
        return not self._stopped and (self.process is None or self.process.poll() is None)

    def stop(self) -> bool:
        """Stop the VM (again, if it did not end the first time); whether it is gone."""
        if self._gone:
            return True
        self._stopped = True
        if self.session is not None:
            with contextlib.suppress(OSError):
                self.session.channel.close()
        if self.proxy is not None:
            self.proxy.stop()
        command = self.launcher.stop(self.sandbox_id)
        if command is not None:
            try:
                done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=START_TIMEOUT, check=False)
                self._gone = done.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                self._gone = False
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT)
            self._gone = self.process.poll() is not None
        if self._gone:
            assert self._lock is not None
            self._lock.release()
            shutil.rmtree(self.workdir, ignore_errors=True)
            if self.record is not None:
                self.record.settle(strict=False)  # (a record left, a later reconcile takes)
        return self._gone


class LeaseHandle:
    """What an execution sees of the guest it borrowed (the Handle its Sandbox or GuestHandle
    uses): ending it hands the guest back to the daemon, to keep (`release(True)`) or to stop
    (`kill`)."""

    def __init__(self, daemon: wsb_daemon.Daemon, lent: wsb_daemon.Lease) -> None:
        self._daemon, self._lease = daemon, lent
        self.guest: WsbGuest = lent.guest  # type: ignore[assignment]
        self.pid = self.guest.pid
        self._released = False
        self._seen = len(self._denials())  # (a kept guest's proxy logged earlier executions)

    def release(self, reuse: bool) -> None:
        """Hand the guest back. A guest without a network is never kept: its channel (the
        spool) is the session's whole log in a folder its commands may reach, so a later
        execution could read or forge an earlier one's frames; the next boots afresh."""
        if not self._released:
            self._released = True
            self._daemon.release(self._lease, reuse=reuse and self.guest.plan.networking)

    def kill(self) -> None:
        self.release(reuse=False)

    def wait(self, timeout: float | None = None) -> int | None:
        return 0 if self._released else None

    def network_records(self) -> list[dict]:
        return self._denials()[self._seen:]

    def refusals(self) -> list[Violation]:
        return []  # (no watch in the guest reports what it refused: docs/vm.md)

    def _denials(self) -> list[dict]:
        return [] if self.guest.proxy is None else self.guest.proxy.denials()


def _lent(lent: wsb_daemon.Lease) -> boot.Session:
    """The guest's session, its handle this execution's."""
    session = lent.session
    session.handle = LeaseHandle(daemon(), lent)  # type: ignore[assignment]
    return session


def start_guest(request: LaunchRequest) -> WsbGuest:
    """A guest for the agent's launch `request`, started (wsb_daemon's `start`)."""
    _reconcile()
    boot_id = secrets.token_hex(16)
    workdir = wsb_ledger.workdir(boot_id)
    port = _free_port() if request.network.mode == "allowlist" else None
    guest = WsbGuest(request, _plan(request, workdir, boot_id, port), wsb_launcher.here(),
                     workdir)
    guest.start()
    return guest


def _reconcile() -> None:
    """End what processes killed without their exit handlers left (wsb_ledger): a guest of
    theirs still running would fail this boot (one Windows Sandbox per host)."""
    ledger = Ledger()
    registry.load_record_kinds()  # (this host's backends' kinds, before any record is read)
    ledger.reconcile()
    ledger.check()


def guest_shape(request: LaunchRequest) -> tuple:
    """What a guest for `request` would offer, planned against the filesystem now (refusing
    what no guest can enforce)."""
    check = os.path.join(statedir.state_dir(), "wsb", "check")
    port = PLACEHOLDER_PORT if request.network.mode == "allowlist" else None
    return _plan(request, check, "0" * 32, port).shape()


@functools.cache
def daemon() -> wsb_daemon.Daemon:
    """This process's keeper of its guest; its guests are stopped when the process exits."""
    made = wsb_daemon.Daemon(start_guest, guest_shape)
    atexit.register(made.close)
    return made


def guest_python() -> str:
    """The interpreter the guest runs: the base installation's (mapped read-only with its
    prefix), never a venv's python.exe, a launcher that needs its pyvenv.cfg (not mapped)."""
    return os.path.join(os.path.realpath(sys.base_prefix), "python.exe")


def _plan(request: LaunchRequest, workdir: str, boot_id: str,
          proxy_port: int | None) -> wsb_plan.Plan:
    return wsb_plan.plan(request, boot_dir=os.path.join(workdir, "boot"),
                         rendezvous_dir=os.path.join(workdir, "rendezvous"), boot_id=boot_id,
                         view=wsb_plan.DISK, proxy_port=proxy_port)


def _free_port() -> int:
    """A TCP port free on this host now, for the proxy (opened in the guest's firewall
    before the host knows the address it will serve on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _prepare(workdir: str, guest: wsb_plan.Plan, python: str, secret: bytes,
             config: str) -> None:
    """The per-boot folders, in the user's private state directory."""
    boot_dir = os.path.join(workdir, "boot")
    rendezvous = os.path.join(workdir, "rendezvous")
    for path in (boot_dir, rendezvous):
        os.makedirs(path, mode=0o700)
    _write(os.path.join(boot_dir, wsb_config.BOOTSTRAP),
           wsb_bootstrap.encode_script(wsb_bootstrap.script(guest, python, boot.PACKAGE_DIR)))
    _write(os.path.join(boot_dir, wsb_bootstrap.GUEST_ENTRY), wsb_bootstrap.GUEST_PY.encode())
    for mask in guest.masks:
        os.makedirs(mask.host, mode=0o700)
        _write(os.path.join(mask.host, f"{wsb_plan.MASK_MARKER}-{guest.boot_id}"), b"")
    _write(os.path.join(rendezvous, rz.SECRET_FILE), secret)
    if not guest.networking:
        create(rendezvous)
    _write(os.path.join(workdir, CONFIG_FILE), config.encode("utf-8"))


def attach(rendezvous: str, secret: bytes, boot_id: str, timeout: float,
           alive: Callable[[], bool], *, networking: bool
           ) -> tuple[FramedChannel, dict, rz.Ready]:
    """Wait for the guest's rendezvous and check it; over TCP connect and check the agent's
    answer to a fresh challenge; then greet the agent. (The channel, the agent's hello, the
    rendezvous.)"""
    deadline = time.monotonic() + timeout
    path = os.path.join(rendezvous, rz.RENDEZVOUS_FILE)
    while (data := _read(path)) is None:
        if not alive():
            raise SessionError("session_boot_failed", "Windows Sandbox ended before the guest "
                               "published its rendezvous")
        if time.monotonic() >= deadline:
            raise SessionError("session_boot_failed", f"no rendezvous from the guest in "
                               f"{timeout:g}s")
        time.sleep(POLL)
    record = rz.parse(data)
    if isinstance(record, rz.Refused):
        raise SetupError(record.code, f"the guest refused to start: {record.message}", "guest")
    rz.verify(record, secret, boot_id)
    if (record.transport == rz.TCP) != networking:
        kind = "with" if networking else "without"
        raise rz.RendezvousError("rendezvous_invalid", f"a guest {kind} a network offered the "
                                 f"{record.transport} channel")
    channel = (_connect(record, secret, deadline) if networking
               else SpoolChannel(rendezvous, secret))
    try:
        channel.send(boot.greeting(secret, False))
        reply = channel.receive(max(deadline - time.monotonic(), 0))
    except BaseException:
        channel.close()
        raise
    if reply is None or reply.type != "hello":
        channel.close()
        raise SessionError("session_boot_failed", "the agent did not answer hello"
                           if reply is None else f"the agent answered {reply.type}")
    return channel, reply.body, record


def _connect(record: rz.Ready, secret: bytes, deadline: float) -> SocketChannel:
    """The agent's TCP channel, once its end has proven it holds the boot's secret."""
    left = max(deadline - time.monotonic(), 0.1)
    sock = socket.create_connection((record.address, record.port), min(CONNECT_TIMEOUT, left))
    try:
        challenge = secrets.token_bytes(rz.CHALLENGE_SIZE)
        sock.sendall(challenge)
        if not hmac.compare_digest(_receive(sock, rz.CHALLENGE_SIZE),
                                   rz.answer(secret, challenge)):
            raise rz.RendezvousError("agent_proof_invalid", "the guest's endpoint does not hold "
                                     "this boot's secret")
    except BaseException:
        sock.close()
        raise
    return SocketChannel(sock)


class GuestOnly(socket.socket):
    """A listener that hands on only connections from one address (the guest's); any other is
    closed unanswered."""

    def __init__(self, guest: str) -> None:
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.guest = guest

    def accept(self) -> tuple[socket.socket, tuple]:
        while True:
            conn, peer = super().accept()
            if peer[0] == self.guest:
                return conn, peer
            conn.close()


def serve_proxy(request: LaunchRequest, record: rz.Ready, port: int) -> Proxy:
    """Stockade's proxy (the allowlist, its address guard and denial log) on the host's address
    the guest named and the port its firewall opens, for the guest's address only."""
    if ipaddress.IPv4Address(record.host).is_loopback:
        raise rz.RendezvousError("rendezvous_invalid", "the guest named a loopback address as "
                                 "the host's: the proxy is served on the sandbox's switch only")
    listener = GuestOnly(record.address)
    try:
        listener.bind((record.host, port))
        listener.listen(64)
    except OSError as exc:
        listener.close()
        raise SessionError("session_boot_failed", f"the proxy cannot listen on "
                           f"{record.host}:{port} ({exc.strerror})") from None
    proxy = Proxy(request.network.allow, request.network.deny, request.request_id)
    proxy.start(listener)
    return proxy


def _read(path: str) -> bytes | None:
    """The rendezvous file's first bytes (one more than the bound), or None while it is
    absent. Opened without following a link."""
    try:
        fd = lease.open_record(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise rz.RendezvousError("rendezvous_invalid", f"the rendezvous file cannot be opened "
                                 f"({exc.strerror})") from None
    try:
        return lease.read_at(fd, rz.MAX_SIZE + 1, 0)
    finally:
        os.close(fd)


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise SessionError("session_boot_failed", "the guest closed the connection during "
                               "the challenge")
        data += chunk
    return data


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def command_env(request: LaunchRequest, session: boot.Session) -> dict[str, str]:
    """A command's environment in the guest: with `allowlist`, the proxy variables name where
    the guest reaches the host's proxy."""
    variables = dict(request.env)
    address = session.handle.guest.proxy_address  # type: ignore[attr-defined]
    if address is not None:
        proxy = proxy_environment(address[1], address[0], case_insensitive=True)
        variables = with_proxy(variables, proxy, case_insensitive=True)
    return variables


class WindowsSandbox(Sandbox):
    """`stockade.Sandbox` whose commands run in a Windows Sandbox guest of its own (Windows hosts
    only; elsewhere UnavailableError `windows_sandbox_unavailable` before anything is done).
    Closing it stops the guest."""

    containment = BACKEND

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, workspace: str | os.PathLike | None = None,
                 attempts: int = boot.BOOT_ATTEMPTS, timeout: float = wsb_daemon.BOOT_TIMEOUT,
                 keep_detached: bool = False) -> None:
        _refuse_elsewhere()
        if keep_detached:  # (refused, never ignored: the Windows agent cannot keep them)
            raise UnenforceableError("keep_detached", "keep_detached: the Windows guest's agent "
                                     "cannot keep detached processes; open the sandbox "
                                     "without it")
        self._attempts, self._timeout = attempts, timeout
        super().__init__(policy, preset=preset, workspace=workspace)

    def _boot(self, policy: Policy, ctx: CompileContext) -> boot.Session:
        return _lent(daemon().acquire(boot.agent_request(policy, ctx), timeout=self._timeout,
                                      attempts=self._attempts, fresh=True))

    def _command(self, argv: Sequence[str], cwd: str | os.PathLike | None,
                 env: Mapping[str, str], timeout: float | None) -> LaunchRequest:
        request = super()._command(argv, cwd, env, timeout)
        return replace(request, env=tuple(sorted(command_env(request, self._session).items())))

    def _result(self, request: LaunchRequest, ending: Ending, duration: float,
                records: list[dict], refused: list[Violation]) -> Result:
        return replace(super()._result(request, ending, duration, records, refused),
                       backend=BACKEND)


class WindowsSandboxBackend(GuestBackend):
    """Containment "vm" on Windows: each launch runs in the process's Windows Sandbox guest,
    kept for the next launch that fits it (wsb_daemon; registered by vm/registration.py)."""

    name = BACKEND
    mechanism = "a Windows Sandbox guest running the Windows agent (docs/windows-sandbox.md)"
    sandbox = WindowsSandbox

    def probe(self) -> None:
        _refuse_elsewhere()
        wsb_launcher.here()

    def plan(self, agent: LaunchRequest) -> None:
        guest_shape(agent)

    def boot(self, agent: LaunchRequest) -> boot.Session:
        return _lent(daemon().acquire(agent))

    def command_env(self, request: LaunchRequest, session: boot.Session) -> dict[str, str]:
        return command_env(request, session)

    def denials(self, session: boot.Session) -> list[dict]:
        return session.handle.network_records()

    def end(self, session: boot.Session, *, killed: bool, reusable: bool) -> None:
        session.handle.release(reuse=reusable)  # type: ignore[attr-defined]


def _refuse_elsewhere() -> None:
    if sys.platform != "win32":
        raise UnavailableError("windows_sandbox_unavailable",
                               "Windows Sandbox runs on Windows hosts only")
