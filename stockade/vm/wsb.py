"""`WindowsSandbox`: `stockade.Sandbox` with a Windows Sandbox guest as its boundary
(docs/windows-sandbox.md). The same `run`/`stream`/`ping`/`close`, the same protocol and agent
as the Linux session and the QEMU driver; what differs is the transport (a TCP connection
across the sandbox's virtual switch) and the hand-over of the secret (the rendezvous folder).

A boot: compile the agent's request; plan the guest (wsb_plan: refusals first); find the
launcher (wsb_launcher); take the host's lease (wsb_lock: `busy`); write the per-boot folders
(the bootstrap, the guest entry and the masks, read-only in the guest; the secret, in the
read-write rendezvous folder); start the sandbox; wait for the rendezvous, check its proof,
connect, check the agent's answer to a challenge, and greet the agent (`attach`).
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from stockade.errors import SetupError, StockadeError, UnavailableError, UnenforceableError
from stockade.launch.compile import CompileContext
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result
from stockade.lifecycle import lease, statedir
from stockade.policy import Policy
from stockade.session import boot
from stockade.session.errors import SessionError
from stockade.session.exchange import Ending
from stockade.session.guest import GuestBackend
from stockade.session.protocol import Message
from stockade.session.sandbox import Sandbox
from stockade.vm import wsb_bootstrap, wsb_config, wsb_launcher, wsb_lock, wsb_plan
from stockade.vm import wsb_rendezvous as rz
from stockade.vm.wsb_channel import SocketChannel

BACKEND = "windows-sandbox"
BOOT_TIMEOUT = 300.0  # seconds from the launch to the agent's hello (a Windows guest is slow)
CONNECT_TIMEOUT = 10.0  # seconds for the TCP connection and the agent's answer
POLL = 0.5  # seconds between looks at the rendezvous folder
START_TIMEOUT = 120.0  # seconds `wsb start` / `wsb stop` may take
CONFIG_FILE = "sandbox.wsb"


class WsbHandle:
    """The sandbox this host started: stopping it (`wsb stop`, or ending WindowsSandbox.exe)
    also drops the host's lease and removes the per-boot folders. There is no pid to wait on
    with the CLI: `wait` then only reports a sandbox already stopped."""

    def __init__(self, launcher: wsb_launcher.Launcher, sandbox_id: str,
                 process: subprocess.Popen | None, workdir: str, lock: wsb_lock.HostLock) -> None:
        self.launcher = launcher
        self.sandbox_id = sandbox_id
        self.process = process
        self.workdir = workdir
        self._lock = lock
        self._stopped = False

    def running(self) -> bool:
        return not self._stopped and (self.process is None or self.process.poll() is None)

    def kill(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            stop = self.launcher.stop(self.sandbox_id)
            if stop is not None:
                subprocess.run(stop, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=START_TIMEOUT, check=False)
            elif self.process is not None and self.process.poll() is None:
                self.process.kill()
            if self.process is not None:
                self.process.wait()
        finally:
            self._lock.release()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def wait(self, timeout: float | None = None) -> int | None:
        if self._stopped:
            return 0
        if self.process is None or self.launcher.kind != wsb_launcher.PROGRAM:
            return None
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.kill()
        return status


def boot_wsb(request: LaunchRequest, *, attempts: int = boot.BOOT_ATTEMPTS,
             timeout: float = BOOT_TIMEOUT) -> boot.Session:
    """A guest running the agent's launch `request` (session/boot.py), whose agent has said
    hello. Refusals (policy, launcher, `busy`, a guest that refuses) raise at once; a guest
    that does not answer is retried, `attempts` times in all, then `session_boot_failed`."""
    root = os.path.join(statedir.state_dir(), "wsb")
    failures = []
    for _ in range(attempts):
        boot_id = secrets.token_hex(16)
        workdir = os.path.join(root, boot_id)
        guest = _plan(request, workdir, boot_id)
        launcher = _launcher()
        handle, secret = _start(launcher, guest, request, workdir)
        try:
            channel, hello = attach(os.path.join(workdir, "rendezvous"), secret, boot_id,
                                    timeout, handle.running)
        except SessionError as exc:
            failures.append(exc.message)
            handle.kill()
            continue
        except BaseException:
            handle.kill()
            raise
        return boot.Session(request, handle, channel, hello)  # type: ignore[arg-type]
    raise SessionError("session_boot_failed", f"Windows Sandbox did not answer after "
                       f"{attempts} attempts: {failures[-1]}")


def _plan(request: LaunchRequest, workdir: str, boot_id: str) -> wsb_plan.Plan:
    return wsb_plan.plan(request, boot_dir=os.path.join(workdir, "boot"),
                         rendezvous_dir=os.path.join(workdir, "rendezvous"), boot_id=boot_id,
                         view=wsb_plan.DISK)


def _launcher() -> wsb_launcher.Launcher:
    system32 = os.path.join(os.environ.get("SystemRoot", "C:\\Windows"), "System32")
    return wsb_launcher.choose(shutil.which, os.path.isfile, system32)


def _start(launcher: wsb_launcher.Launcher, guest: wsb_plan.Plan, request: LaunchRequest,
           workdir: str) -> tuple[WsbHandle, bytes]:
    """Take the lease, write the per-boot folders, start the sandbox; (its handle, the
    boot's secret)."""
    lock = wsb_lock.acquire(wsb_lock.default_path())
    secret = secrets.token_bytes(rz.SECRET_SIZE)
    sandbox_id = _guid(guest.boot_id)
    process = None
    try:
        config = wsb_config.render(guest)
        _prepare(workdir, guest, request.argv[0], secret, config)
        argv = launcher.start(sandbox_id, config, os.path.join(workdir, CONFIG_FILE))
        if launcher.kind == wsb_launcher.PROGRAM:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        else:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=START_TIMEOUT, check=False)
            if done.returncode != 0:
                tail = done.stderr[-300:].decode("utf-8", "replace").strip()
                raise SetupError("windows_sandbox_start_failed",
                                 f"wsb start exited with {done.returncode}: {tail}", "launch")
    except BaseException:
        lock.release()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return WsbHandle(launcher, sandbox_id, process, workdir, lock), secret


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
    _write(os.path.join(workdir, CONFIG_FILE), config.encode("utf-8"))


def attach(rendezvous: str, secret: bytes, boot_id: str, timeout: float,
           alive: Callable[[], bool]) -> tuple[SocketChannel, dict]:
    """Wait for the guest's rendezvous, check it, connect, check the agent's answer to a fresh
    challenge, then greet the agent; (channel, the agent's hello)."""
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
        raise _refusal(record)
    rz.verify(record, secret, boot_id)
    left = max(deadline - time.monotonic(), 0.1)
    sock = socket.create_connection((record.address, record.port), min(CONNECT_TIMEOUT, left))
    try:
        challenge = secrets.token_bytes(rz.CHALLENGE_SIZE)
        sock.sendall(challenge)
        if not hmac.compare_digest(_receive(sock, rz.CHALLENGE_SIZE),
                                   rz.answer(secret, challenge)):
            raise rz.RendezvousError("agent_proof_invalid", "the guest's endpoint does not hold "
                                     "this boot's secret")
        channel = SocketChannel(sock)
        channel.send(Message("hello", body={"nonce": secret.hex()}))
        reply = channel.receive(max(deadline - time.monotonic(), 0))
    except BaseException:
        sock.close()
        raise
    if reply is None or reply.type != "hello":
        channel.close()
        raise SessionError("session_boot_failed", "the agent did not answer hello"
                           if reply is None else f"the agent answered {reply.type}")
    return channel, reply.body


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


def _refusal(record: rz.Refused) -> StockadeError:
    message = f"the guest refused to start: {record.message}"
    if record.code == "windows_agent_unavailable":
        return UnavailableError(record.code, message)
    return SetupError(record.code, message, "guest")


def _guid(boot_id: str) -> str:
    return f"{boot_id[:8]}-{boot_id[8:12]}-{boot_id[12:16]}-{boot_id[16:20]}-{boot_id[20:]}"


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class WindowsSandbox(Sandbox):
    """`stockade.Sandbox` whose commands run in a Windows Sandbox guest (Windows hosts only;
    elsewhere UnavailableError `windows_sandbox_unavailable` before anything is done).
    Closing it stops the sandbox."""

    containment = BACKEND

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, workspace: str | os.PathLike | None = None,
                 attempts: int = boot.BOOT_ATTEMPTS, timeout: float = BOOT_TIMEOUT,
                 keep_detached: bool = False) -> None:
        _refuse_elsewhere()
        if keep_detached:  # (refused, never ignored: a Windows guest has no such agent yet)
            raise UnenforceableError("keep_detached", "keep_detached: the Windows guest's agent "
                                     "cannot keep detached processes; open the sandbox "
                                     "without it")
        self._attempts, self._timeout = attempts, timeout
        super().__init__(policy, preset=preset, workspace=workspace)

    def _boot(self, policy: Policy, ctx: CompileContext) -> boot.Session:
        return boot_wsb(boot.agent_request(policy, ctx), attempts=self._attempts,
                        timeout=self._timeout)

    def _network_records(self) -> list[dict]:
        return []  # (no egress proxy: the plan refuses `allowlist` until one is wired)

    def _result(self, request: LaunchRequest, ending: Ending, duration: float,
                records: list[dict]) -> Result:
        return replace(super()._result(request, ending, duration, records), backend=BACKEND)


class WindowsSandboxBackend(GuestBackend):
    """Containment "vm" on Windows: each launch a fresh Windows Sandbox guest (registered by
    vm/registration.py; the manager chooses it as any backend)."""

    name = BACKEND
    mechanism = "a Windows Sandbox guest running the session agent (docs/windows-sandbox.md)"
    sandbox = WindowsSandbox

    def probe(self) -> None:
        _refuse_elsewhere()
        _launcher()

    def plan(self, agent: LaunchRequest) -> None:
        _plan(agent, os.path.join(statedir.state_dir(), "wsb", "check"), "0" * 32)

    def boot(self, agent: LaunchRequest) -> boot.Session:
        return boot_wsb(agent)


def _refuse_elsewhere() -> None:
    if sys.platform != "win32":
        raise UnavailableError("windows_sandbox_unavailable",
                               "Windows Sandbox runs on Windows hosts only")

