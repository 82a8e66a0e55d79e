"""The sandbox's pid 1 and the command it starts.

pid 1 builds the filesystem view, starts the command, reaps every orphan, and exits as soon as
the command exits — which makes the kernel kill everything left in the pid namespace,
daemonised or double-forked descendants included. It also exits when its owner goes away (the
lifeline pipe reaches EOF), so nothing outlives the process that asked for it.

The command's process (forked ahead of the launch, see _Command) applies the layers in order —
rlimits, Landlock, capability drop, seccomp — closes every descriptor but stdio, and execs with
the closed environment.
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
from stockade.linux.launcher import LAUNCH_FDS, encode_frame, read_frame
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
    _, fds = fdpass.recv_fds(handoff, LAUNCH_FDS)
    if len(fds) != LAUNCH_FDS:
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
        raw, bpf, weaken, umask = read_frame(request_fd)
        command.send(encode_frame(raw, bpf, weaken, umask))  # it decodes while we mount
        request = LaunchRequest.decode(raw)
    except (StockadeError, EOFError, OSError) as exc:
        _fail(status_fd, "setup", "request_invalid", str(exc), "request")
    stage(status_fd, "request")
    with socket.socket(fileno=control_fd) as control:
        try:
            if request.network.mode == "allowlist":
                with net.proxy_listener(SANDBOX_PORT) as listener:
                    fdpass.send_fds(control, b"P", [listener.fileno()])
        except OSError as exc:
            _fail(status_fd, "setup", "proxy_listen_failed", exc.strerror or str(exc), "network")
    run(request, weaken, command, handoff, stdio, status_fd, request_fd)


def run(request: LaunchRequest, weaken: frozenset[str], command: _Command,
        handoff: socket.socket, stdio: list[int], status_fd: int, lifeline_fd: int) -> NoReturn:
    """Build the sandbox and run the command in it, as pid 1."""
    try:
        pid_max = limits.cap_pid_namespace(request.limits)
        protected = mnt.build(request, STAGE, weaken)
        stage(status_fd, "mounts")
        _tell_mounted(handoff)
        command.go(stdio, status_fd)
    except StockadeError as exc:
        _fail(status_fd, "setup", exc.code, exc.message, getattr(exc, "stage", ""))
    except OSError as exc:
        _fail(status_fd, "setup", "setup_failed", f"{exc.strerror} ({exc.filename or ''})",
              "mount")
    failure = _read_all(command.report)
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
    critical path. It gets the frame as soon as pid 1 has it (and decodes it while pid 1 builds
    the mounts), then stdio and a go-ahead once the filesystem view is in place. pivot_root
    moves it into the new root along with pid 1: they share the mount namespace."""

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

    def go(self, stdio: list[int], status_fd: int) -> None:
        fdpass.send_fds(self.channel, b"G", [*stdio, status_fd])
        self.channel.close()
        fdpass.close_all(stdio)


def _command_main(channel: socket.socket, report_w: int) -> NoReturn:
    """Body of the pre-forked command process: wait for the launch, then confine and exec."""
    os.setsid()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    try:
        raw, bpf, weaken, umask = read_frame(channel.fileno())
        request = LaunchRequest.decode(raw)
        _, fds = fdpass.recv_fds(channel, 4)
    except (StockadeError, EOFError, OSError):
        os._exit(127)  # pid 1 failed too and reports it; it is about to take us down
    channel.close()
    if len(fds) != 4:
        os._exit(127)
    *stdio, status_fd = fds
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    fdpass.close_all(stdio)
    _exec_command(request, bpf, weaken, umask, report_w, status_fd)


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


def _exec_command(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], umask: int,
                  report_w: int, status_fd: int) -> NoReturn:
    """Body of the command's process: confine, then exec. Never returns."""
    step = "privilege"
    try:
        if "rlimits" not in weaken:
            limits.apply_rlimits(request.limits)
        os.chdir(request.cwd)
        os.umask(umask)
        if "privileges" not in weaken:
            privilege.prepare()
        step = "landlock"
        if "landlock" not in weaken:
            landlock.apply(_landlock_rules(request))
        step = "privilege"
        if "privileges" not in weaken:
            privilege.drop_all()
        step = "seccomp"
        if "seccomp" not in weaken:
            seccomp.install(bpf)
        stage(status_fd, "confine")
        privilege.close_fds({0, 1, 2, report_w})
        step = "exec"
        os.execvpe(request.argv[0], list(request.argv), dict(request.env))
    except OSError as exc:
        if step == "exec" and exc.errno in START_ERRNOS:
            code = "command_not_found" if exc.errno == errno.ENOENT else "command_not_executable"
            report = {"kind": "start", "code": code, "stage": step,
                      "message": f"{request.argv[0]}: {exc.strerror}"}
        else:
            report = {"kind": "setup", "code": f"{step}_failed", "stage": step,
                      "message": exc.strerror or str(exc)}
    except StockadeError as exc:
        report = {"kind": "setup", "code": exc.code, "stage": step, "message": exc.message}
    except BaseException as exc:  # noqa: BLE001 - anything here must become a typed report
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
