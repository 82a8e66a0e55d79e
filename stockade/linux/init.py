"""The sandbox's pid 1 and the command it starts.

pid 1 builds the filesystem view, starts the command, reaps every orphan, and exits as soon as
the command exits — which makes the kernel kill everything left in the pid namespace,
daemonised or double-forked descendants included. It also exits when its owner goes away (the
lifeline pipe reaches EOF), so nothing outlives the process that asked for it.

The command's process (forked ahead of the launch, see _Command) applies the layers in order —
Landlock, capability drop, seccomp, then the launch's rlimits — closes every descriptor but
stdio, and execs with the closed environment.

A spare may be prepared for a view (see launcher.view_frame) before its launch exists: pid 1
builds the mounts and the command's process confines itself, and the launch only brings what
is its own (argv, environment, working directory, umask, stdio). The zygote hands such a spare
only to a launch with the same view frame whose fresh survey of the host has the same identity
(mnt.Survey.identity); pid 1 checks the view frame again.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import time
from typing import NoReturn

from stockade.errors import StockadeError
from stockade.launch.request import LaunchRequest
from stockade.linux import fdpass, landlock, limits, mnt, net, privilege, seccomp
from stockade.linux.launcher import LAUNCH_FDS, VIEW_MAX, parse_frame, read_frame, view_frame
from stockade.linux.syscalls import prctl
from stockade.net.env import SANDBOX_PORT

PR_SET_DUMPABLE = 4
STAGE = "/tmp"          # any existing directory: the new root is mounted over it privately
START_ERRNOS = (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EPERM)
DEVICE_GRANTS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/tty", "/dev/pts")


def emit(fd: int, **event: object) -> None:
    """Write one JSON-line event to the owner's status pipe."""
    os.write(fd, json.dumps(event).encode() + b"\n")


def stage(fd: int, name: str) -> None:
    """Mark the end of a launch stage (CLOCK_MONOTONIC is shared by all processes)."""
    emit(fd, event="stage", name=name, t=time.monotonic())


def serve(handoff: socket.socket) -> NoReturn:
    """Body of pid 1: wait for one launch's descriptors, then run it. Never returns.

    Its lifetime is bound to the zygote while it waits (the handoff socket closes) and to the
    owner once it runs a launch (the lifeline closes)."""
    prctl(PR_SET_DUMPABLE, 0)
    socket.sethostname("stockade")
    command = _Command.prefork(handoff)
    message, fds = fdpass.recv_fds(handoff, LAUNCH_FDS, size=VIEW_MAX + 1)
    prepared = None
    if message.startswith(b"V") and not fds:
        prepared = _prepare(message[1:], command, handoff)
        message, fds = fdpass.recv_fds(handoff, LAUNCH_FDS)
    if len(fds) != LAUNCH_FDS:
        fdpass.close_all(fds)
        os._exit(0)  # the zygote is gone: nobody will ever use this sandbox
    *stdio, request_fd, status_fd, control_fd = fds
    # pid 1's own standard streams are /dev/null: it holds the command's only until the command
    # has them, so that its readers see the end when the command (and what it started) ends.
    null = os.open(os.devnull, os.O_RDWR)
    for target in range(3):
        os.dup2(null, target)
    os.close(null)
    stage(status_fd, "handoff")
    if os.getpid() != 1:
        _fail(status_fd, "setup", "setup_failed", "the sandbox's init is not pid 1 of a pid "
              "namespace of its own", "namespaces")
    try:
        frame = read_frame(request_fd)
        if prepared is None:
            command.send(frame)  # it decodes while we mount
        raw, bpf, weaken, _ = parse_frame(frame)
        request = LaunchRequest.decode(raw)
    except (StockadeError, EOFError, OSError) as exc:
        _fail(status_fd, "setup", "request_invalid", str(exc), "request")
    if prepared is not None and view_frame(request, bpf, weaken) != prepared.view:
        _fail(status_fd, "setup", "setup_failed", "the prepared sandbox was made for another "
              "view than this launch's", "request")
    stage(status_fd, "request")
    with socket.socket(fileno=control_fd) as control:
        try:
            if request.network.mode == "allowlist":
                with net.proxy_listener(SANDBOX_PORT) as listener:
                    fdpass.send_fds(control, b"P", [listener.fileno()])
        except OSError as exc:
            _fail(status_fd, "setup", "proxy_listen_failed", exc.strerror or str(exc), "network")
    run(request, frame, weaken, command, handoff, stdio, status_fd, request_fd, prepared)


class _Prepared:
    """A view made ahead of its launch: mounts built, the command's process confined."""

    def __init__(self, view: bytes, protected: list[str], pid_max: int | None) -> None:
        self.view, self.protected, self.pid_max = view, protected, pid_max


def _prepare(view: bytes, command: _Command, handoff: socket.socket) -> _Prepared:
    """Build the view's mounts and confine the command's process before any launch, then tell
    the zygote the identity of what was mounted (see mnt.Survey.identity). Whatever fails
    here, this spare just ends: nobody is waiting for it, and a launch that needs this view
    gets a fresh sandbox that reports the failure."""
    try:
        if os.getpid() != 1:
            os._exit(0)
        raw, _, weaken, _ = parse_frame(view)
        request = LaunchRequest.decode(raw)
        command.send(view)
        pid_max = limits.cap_pid_namespace(request.limits)
        protected, identity = mnt.build(request, STAGE, weaken)
        if command.confine() is not None:
            os._exit(0)
        handoff.send(b"M" + identity)
    except BaseException:  # noqa: BLE001 - see above
        os._exit(0)
    return _Prepared(view, protected, pid_max)


def run(request: LaunchRequest, frame: bytes, weaken: frozenset[str], command: _Command,
        handoff: socket.socket, stdio: list[int], status_fd: int, lifeline_fd: int,
        prepared: _Prepared | None) -> NoReturn:
    """Build the sandbox (unless `prepared`) and run the command in it, as pid 1."""
    try:
        if prepared is None:
            pid_max = limits.cap_pid_namespace(request.limits)
            protected, _ = mnt.build(request, STAGE, weaken)
            stage(status_fd, "mounts")
            _tell_mounted(handoff)
            failure = command.confine()
        else:
            pid_max, protected, failure = prepared.pid_max, prepared.protected, None
            stage(status_fd, "mounts")
            handoff.close()
        if failure is None:
            stage(status_fd, "confine")
            command.go(frame, stdio)
            failure = _read_all(command.report)
    except StockadeError as exc:
        _fail(status_fd, "setup", exc.code, exc.message, getattr(exc, "stage", ""))
    except OSError as exc:
        _fail(status_fd, "setup", "setup_failed", f"{exc.strerror} ({exc.filename or ''})",
              "mount")
    if failure:
        os.waitpid(command.pid, 0)
        info = json.loads(failure)
        _fail(status_fd, info["kind"], info["code"], info["message"], info["stage"])
    enforced: dict[str, object] = {"weakened_for_testing": sorted(weaken)} if weaken else {}
    enforced |= {
        "namespaces": ["user", "mnt", "pid", "ipc", "uts", "net", "cgroup"],
        "landlock": landlock.describe(),
        "seccomp": {"mode": "filter", "denied_syscalls": len(seccomp.DENIED_SYSCALLS),
                    "clone3": "ENOSYS", "ioctl": "TIOCSTI/TIOCLINUX denied"},
        "protected_mounts": len(protected),
        "pid_max": pid_max,
        "limits": limits.describe(request.limits),
        "prepared_ahead": prepared is not None,
    }
    stage(status_fd, "exec")
    emit(status_fd, event="started", enforced=enforced)
    code, sig = _supervise(command.pid, lifeline_fd)
    stage(status_fd, "run")
    _drain()
    # Only now, with pid 1 alone in the sandbox: the owner may settle on this event without
    # waiting for pid 1 itself to exit (and the kernel to tear the namespaces down).
    emit(status_fd, event="exit", exit_code=code, signal=sig)
    os.close(status_fd)  # the owner's end sees EOF now, not after our address space is freed
    os._exit(0)


def _drain() -> None:
    """Kill every other process of the sandbox and reap them all (orphans are re-parented to
    pid 1), so that none is left when the owner hears the command's exit."""
    if os.getpid() == 1:  # (serve refused to run otherwise: kill(-1) elsewhere hits the host)
        try:
            os.kill(-1, signal.SIGKILL)  # from a pid namespace's init: all in it but us
        except ProcessLookupError:
            pass  # nobody else
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _tell_mounted(handoff: socket.socket) -> None:
    """Let the zygote make the next skeleton (nobody may be listening: fine)."""
    try:
        handoff.send(b"M")
    except OSError:
        pass
    handoff.close()


class _Command:
    """The command's process, forked before the launch arrives so that forking is off the
    critical path. It gets a frame as soon as pid 1 has one (the launch's, or a view's to
    prepare for) and decodes it while pid 1 builds the mounts; confines itself when pid 1 says
    the filesystem view is in place; and gets the launch's frame, stdio and the status pipe to
    exec with. pivot_root moves it into the new root along with pid 1: they share the mount
    namespace."""

    def __init__(self, pid: int, channel: socket.socket, report: int) -> None:
        self.pid, self.channel, self.report = pid, channel, report

    @classmethod
    def prefork(cls, handoff: socket.socket) -> _Command:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            handoff.close()
            ours.close()
            os.close(report_r)
            _command_main(theirs, report_w)
        theirs.close()
        os.close(report_w)
        return cls(pid, ours, report_r)

    def send(self, frame: bytes) -> None:
        self.channel.sendall(frame)

    def confine(self) -> bytes | None:
        """Have it confine itself; None once it has, else its failure report."""
        self.channel.sendall(b"C")
        if self.channel.recv(1) == b"K":
            return None
        return _read_all(self.report) or b'{"kind": "setup", "code": "setup_failed", ' \
            b'"stage": "confine", "message": "the command process ended"}'

    def go(self, frame: bytes, stdio: list[int]) -> None:
        self.channel.sendall(frame)
        fdpass.send_fds(self.channel, b"G", stdio)
        self.channel.close()
        fdpass.close_all(stdio)


def _command_main(channel: socket.socket, report_w: int) -> NoReturn:
    """Body of the pre-forked command process: confine when told, then exec the launch."""
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    try:
        raw, bpf, weaken, _ = parse_frame(read_frame(channel.fileno()))
        view = LaunchRequest.decode(raw)
        told = channel.recv(1) == b"C"
    except (StockadeError, EOFError, OSError):
        os._exit(127)  # pid 1 failed too and reports it; it is about to take us down
    if not told:
        os._exit(127)
    _confine(view, bpf, weaken, report_w)
    try:
        channel.sendall(b"K")
        frame = read_frame(channel.fileno())
        raw, _, _, umask = parse_frame(frame)
        request = LaunchRequest.decode(raw)
        _, stdio = fdpass.recv_fds(channel, 3)
    except (StockadeError, EOFError, OSError):
        os._exit(127)
    channel.close()
    if len(stdio) != 3:
        os._exit(127)
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    fdpass.close_all(stdio)
    _exec_command(request, weaken, umask, report_w)


def _fail(status_fd: int, kind: str, code: str, message: str, where: str) -> NoReturn:
    emit(status_fd, event="error", kind=kind, code=code, message=message, stage=where)
    os._exit(70 if kind == "setup" else 71)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _supervise(child: int, lifeline_fd: int) -> tuple[int | None, int | None]:
    """Reap orphans until the command exits; die at once if the owner disappears."""
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(lifeline_fd, select.POLLIN | select.POLLHUP)
    while True:
        for fd, _ in poller.poll():
            if fd == lifeline_fd:
                os._exit(1)  # owner gone: pid 1 exiting kills the whole namespace
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                if os.WIFSIGNALED(status):
                    return None, os.WTERMSIG(status)
                return os.WEXITSTATUS(status), None


def _confine(view: LaunchRequest, bpf: bytes, weaken: frozenset[str], report_w: int) -> None:
    """Landlock, capability drop and seccomp, from the view alone (nothing of the launch's own
    is needed): this may run before the launch exists. On failure, report and exit."""
    step = "privilege"
    try:
        if "privileges" not in weaken:
            privilege.prepare()
        step = "landlock"
        if "landlock" not in weaken:
            landlock.apply(_landlock_rules(view))
        step = "privilege"
        if "privileges" not in weaken:
            privilege.drop_all()
        step = "seccomp"
        if "seccomp" not in weaken:
            seccomp.install(bpf)
    except BaseException as exc:  # noqa: BLE001 - anything here must become a typed report
        _report(report_w, exc, step, view)


def _exec_command(request: LaunchRequest, weaken: frozenset[str], umask: int,
                  report_w: int) -> NoReturn:
    """The launch's own part, already confined: rlimits (last, since they bind this Python
    process too), working directory, umask, then exec. Never returns."""
    step = "privilege"
    try:
        if "rlimits" not in weaken:
            limits.apply_rlimits(request.limits)
        os.chdir(request.cwd)
        os.umask(umask)
        privilege.close_fds({0, 1, 2, report_w})
        step = "exec"
        os.execvpe(request.argv[0], list(request.argv), dict(request.env))
    except BaseException as exc:  # noqa: BLE001 - anything here must become a typed report
        _report(report_w, exc, step, request)
    os._exit(127)  # (unreachable: _report exits)


def _report(report_w: int, exc: BaseException, step: str, request: LaunchRequest) -> NoReturn:
    """Tell pid 1 why the command could not start, typed, and exit."""
    if isinstance(exc, OSError) and step == "exec" and exc.errno in START_ERRNOS:
        code = "command_not_found" if exc.errno == errno.ENOENT else "command_not_executable"
        report = {"kind": "start", "code": code, "stage": step,
                  "message": f"{request.argv[0]}: {exc.strerror}"}
    elif isinstance(exc, OSError):
        report = {"kind": "setup", "code": f"{step}_failed", "stage": step,
                  "message": exc.strerror or str(exc)}
    elif isinstance(exc, StockadeError):
        report = {"kind": "setup", "code": exc.code, "stage": step, "message": exc.message}
    else:
        report = {"kind": "setup", "code": "internal_error", "stage": step,
                  "message": exc.__class__.__name__}
    os.write(report_w, json.dumps(report).encode())
    os._exit(127)


def _landlock_rules(request: LaunchRequest) -> landlock.LandlockRules:
    return landlock.LandlockRules(
        read=tuple(g.path for g in request.read) + ("/proc", "/dev"),
        write=tuple(g.path for g in request.write) + ("/tmp", "/dev/shm"),
        devices=DEVICE_GRANTS,
        exec_from_write=request.exec_from_write,
        deny_tcp=request.network.mode in ("none", "allowlist"),
        scope=True,
        tcp_connect_ports=(SANDBOX_PORT,) if request.network.mode == "allowlist" else (),
    )
