"""Booting a QEMU guest whose init is the session agent, and `VmSandbox`: `stockade.Sandbox`
with the VM as its boundary instead of Linux namespaces (docs/vm.md).

The host listens on a unix socket in a private (0700) directory; QEMU connects to it as the
chardev of the guest's virtio-serial port, which the guest's init hands to the agent as its
stdin and stdout. The host accepts one connection, checks with SO_PEERCRED that it is the QEMU
it started, writes the 32-byte secret, then speaks the session protocol (stockade/session) on it.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from stockade.errors import StockadeError, UnavailableError
from stockade.launch import registry
from stockade.launch.compile import CompileContext
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.net.env import proxy_environment
from stockade.net.gate import Resolver
from stockade.net.proxy import Proxy
from stockade.policy import Policy
from stockade.session import boot, protocol
from stockade.session.channel import Channel
from stockade.session.errors import SessionError
from stockade.session.exchange import Ending
from stockade.session.guest import GuestBackend
from stockade.session.sandbox import Sandbox
from stockade.vm import egress, initramfs, machine

BACKEND = "qemu-vm"
BOOT_TIMEOUT = 60.0  # seconds from QEMU's start to the agent's hello (TCG: ~8s here)
ACCEPT_POLL = 0.2  # seconds between checks that QEMU still runs while waiting for it
SETPRIV = "setpriv"  # util-linux
# QEMU is started from this one thread, which lives as long as the process: a parent-death
# signal fires when the thread that forked the child ends, so QEMU started from a short-lived
# thread (a daemon's per-client thread) would die with it rather than with its owner.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stockade-vm")


class VmHandle:
    """The QEMU process this host started, and its private directory, both in the launch
    ledger's `record`. `kill` and `wait` act on that process only (by the Popen that started
    it), and settle the record (the directory removed) once it ended."""

    def __init__(self, process: subprocess.Popen, workdir: str, record: LaunchRecord,
                 proxy: Proxy | None = None) -> None:
        self.process = process
        self.workdir = workdir
        self.record = record
        self.proxy = proxy  # allowlist: the guest's only way out (stockade/vm/egress.py)

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.proxy is not None:
            self.proxy.stop()
        self.record.settle(strict=False)  # what it cannot remove, a later reconcile does
        return status

    def log_tail(self) -> str:
        """The end of the guest console and of QEMU's stderr (for boot failures)."""
        parts = []
        for name in ("console.log", "qemu.err"):
            try:
                with open(os.path.join(self.workdir, name), "rb") as f:
                    text = f.read()[-600:].decode("utf-8", "replace").strip()
            except OSError:
                continue
            if text:
                parts.append(f"{name}: {text}")
        return "; ".join(parts) or "no console output"


def host_kernel() -> initramfs.Kernel:
    """The kernel a guest boots here; UnavailableError (typed) when this host cannot boot one
    (QEMU, setpriv, a static busybox or a suitable kernel missing). Boots nothing."""
    if shutil.which(machine.QEMU) is None:
        raise UnavailableError("vm_qemu_unavailable", f"{machine.QEMU} is not installed")
    if shutil.which(SETPRIV) is None:
        raise UnavailableError("vm_qemu_unavailable", f"{SETPRIV} (util-linux) is not installed")
    if not os.access(initramfs.BUSYBOX, os.X_OK):
        raise UnavailableError("vm_busybox_unavailable",
                               f"{initramfs.BUSYBOX} is missing (install busybox-static)")
    return initramfs.find_kernel()


def _in_the_guest(agent: LaunchRequest) -> LaunchRequest:
    """The agent's launch (session/boot.py) as the guest's init starts it."""
    argv = machine.agent_argv(agent.argv[0], boot.PACKAGE_DIR, os.getuid(), os.getgid(),
                              agent.limits, agent.exec_from_write)
    return replace(agent, argv=tuple(argv))


def boot_vm(agent: LaunchRequest, *, attempts: int = boot.BOOT_ATTEMPTS,
            timeout: float = BOOT_TIMEOUT, resolver: Resolver | None = None,
            keep_detached: bool = False) -> boot.Session:
    """A guest running the agent's launch `agent`, whose agent has said hello. What the VM
    cannot enforce, or a host without QEMU or a suitable kernel, raises at once; a guest that
    does not answer is retried, `attempts` times in all, then `session_boot_failed`.
    `resolver` is the proxy's DNS hook (tests)."""
    request = _in_the_guest(agent)
    guest = machine.plan(request)
    kernel = host_kernel()
    image = initramfs.build(kernel, machine.init_script(guest, list(request.argv)))
    ledger = Ledger()
    registry.load_record_kinds()  # (the kinds of this host's backends, before any is read)
    ledger.reconcile()  # what owners that died left: their directories, their QEMU
    ledger.check()
    failures = []
    for _ in range(attempts):
        handle, listener = _start(kernel, image, guest, request, resolver, ledger)
        try:
            channel, hello = _handshake(handle, listener, timeout, keep_detached)
        except (StockadeError, OSError) as exc:
            failures.append(f"{exc} ({handle.log_tail()})")
            handle.kill()
            continue
        except BaseException:
            handle.kill()
            raise
        finally:
            listener.close()
        return boot.Session(request, handle, channel, hello)  # type: ignore[arg-type]
    raise SessionError("session_boot_failed",
                       f"the VM did not boot after {attempts} attempts: {failures[-1]}")


def _start(kernel: initramfs.Kernel, image: bytes, guest: machine.Guest,
           request: LaunchRequest, resolver: Resolver | None,
           ledger: Ledger) -> tuple[VmHandle, socket.socket]:
    # One record per guest (the session's own, named by the request id, is the daemon's):
    # the directory is in it before it exists, QEMU once it runs, so that whatever an owner
    # killed leaves is removed by the next reconcile.
    record = LaunchRecord(ledger, f"vm-{secrets.token_hex(16)}")
    workdir = os.path.join(tempfile.gettempdir(), record.fresh_name("vm"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    proxy: Proxy | None = None
    process: subprocess.Popen | None = None
    try:
        record.add("dir", workdir)
        os.mkdir(workdir, 0o700)
        initrd = os.path.join(workdir, "initrd")
        with open(initrd, "wb") as f:
            f.write(image)
        path = os.path.join(workdir, "agent.sock")
        if guest.egress:
            proxy = Proxy(request.network.allow, request.network.deny, request.request_id,
                          resolver=resolver, socket_dir=workdir)
            proxy.start()
        argv = machine.qemu_argv(kernel, initrd, path, os.path.join(workdir, "console.log"),
                                 guest, None if proxy is None else proxy.socket_path)
        listener.bind(path)
        listener.listen(1)
        with open(os.path.join(workdir, "qemu.err"), "wb") as err:
            # setpriv sets the parent-death signal in the child without running Python code
            # after fork (preexec_fn is unsafe in threaded programs).
            process = _SPAWNER.submit(
                subprocess.Popen, [SETPRIV, "--pdeathsig", "KILL", "--", *argv],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err).result()
        record.add("process", "qemu", removers.process_identity(process.pid))
    except BaseException:
        listener.close()
        if process is not None:
            process.kill()
            process.wait()
        if proxy is not None:
            proxy.stop()
        record.settle(strict=False)
        raise
    return VmHandle(process, workdir, record, proxy), listener


def _handshake(handle: VmHandle, listener: socket.socket, timeout: float,
               keep_detached: bool) -> tuple[Channel, dict]:
    deadline = time.monotonic() + timeout
    conn = None
    while conn is None:
        if handle.process.poll() is not None:
            raise SessionError("session_boot_failed", "QEMU exited before connecting")
        left = deadline - time.monotonic()
        if left <= 0:
            raise SessionError("session_boot_failed", "QEMU did not connect")
        listener.settimeout(min(left, ACCEPT_POLL))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
    pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    if pid != handle.pid:
        conn.close()
        raise SessionError("session_boot_failed", f"the agent socket's peer is pid {pid}, "
                           f"not QEMU ({handle.pid})")
    conn.setblocking(True)
    nonce = secrets.token_bytes(protocol.NONCE_SIZE)
    conn.sendall(nonce)
    reader = os.fdopen(conn.detach(), "rb", buffering=0)
    channel = Channel(os.fdopen(os.dup(reader.fileno()), "wb", buffering=0), reader)
    try:
        channel.send(boot.greeting(nonce, keep_detached))
        reply = channel.receive(max(deadline - time.monotonic(), 0))
        if reply is None:
            raise SessionError("session_boot_failed", f"no hello from the agent in {timeout:g}s")
        if reply.type != "hello":
            raise SessionError("session_boot_failed", f"the agent answered {reply.type}")
    except BaseException:
        channel.close()
        raise
    return channel, reply.body


class VmSandbox(Sandbox):
    """`stockade.Sandbox` whose commands run in a QEMU guest (see docs/vm.md): the same
    `run`/`stream`/`ping`/`close`, the same protocol and agent. Closing it kills QEMU.
    Also `stockade.VmSandbox`."""

    containment = BACKEND

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, workspace: str | os.PathLike | None = None,
                 attempts: int = boot.BOOT_ATTEMPTS, timeout: float = BOOT_TIMEOUT,
                 resolver: Resolver | None = None, keep_detached: bool = False) -> None:
        self._attempts, self._timeout, self._resolver = attempts, timeout, resolver
        super().__init__(policy, preset=preset, workspace=workspace,
                         keep_detached=keep_detached)

    def _boot(self, policy: Policy, ctx: CompileContext) -> boot.Session:
        return boot_vm(boot.agent_request(policy, ctx), attempts=self._attempts,
                       timeout=self._timeout, resolver=self._resolver,
                       keep_detached=self.keep_detached)

    def _command(self, argv: Sequence[str], cwd: str | os.PathLike | None,
                 env: Mapping[str, str] | None, timeout: float | None) -> LaunchRequest:
        """As in a Linux session, but in allowlist mode the proxy variables name where the
        guest finds the proxy rather than a loopback the guest does not share."""
        request = super()._command(argv, cwd, env, timeout)
        return replace(request, env=tuple(sorted(guest_environment(request).items())))

    def _network_records(self) -> list[dict]:
        return _denials(self._session)

    def _refusals(self) -> list[Violation]:
        return []  # (no watch in the guest reports what it refused: docs/vm.md)

    def _result(self, request: LaunchRequest, ending: Ending, duration: float,
                records: list[dict], refused: list[Violation]) -> Result:
        return replace(super()._result(request, ending, duration, records, refused),
                       backend=BACKEND)


def guest_environment(request: LaunchRequest) -> dict[str, str]:
    """The command's environment in the guest: in allowlist mode the proxy variables name
    where the guest finds the proxy (egress.GUEST_PROXY)."""
    variables = dict(request.env)
    if request.network.mode == "allowlist":
        host, port = egress.GUEST_PROXY
        variables |= proxy_environment(port, host, case_insensitive=False)  # (a Linux guest)
    return variables



class QemuBackend(GuestBackend):
    """Containment "vm" on Linux: each launch a fresh QEMU guest (registered by
    vm/registration.py; the manager chooses it as any backend)."""

    name = BACKEND
    mechanism = "a QEMU guest (TCG) whose init runs the session agent (docs/vm.md)"
    sandbox = VmSandbox

    def probe(self) -> None:
        if not sys.platform.startswith("linux"):
            raise UnavailableError("vm_qemu_unavailable",
                                   "the QEMU driver runs on Linux hosts only")
        host_kernel()

    def plan(self, agent: LaunchRequest) -> None:
        machine.plan(_in_the_guest(agent))

    def boot(self, agent: LaunchRequest) -> boot.Session:
        return boot_vm(agent)

    def command_env(self, request: LaunchRequest, session: boot.Session) -> dict[str, str]:
        return guest_environment(request)

    def denials(self, session: boot.Session) -> list[dict]:
        return _denials(session)


def _denials(session: boot.Session) -> list[dict]:
    proxy = session.handle.proxy  # type: ignore[attr-defined]
    return [] if proxy is None else proxy.denials()
