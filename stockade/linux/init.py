"""The sandbox's pid 1 and the command it starts.

pid 1 builds the filesystem view, starts the command, reaps every orphan, and exits as soon as
the command exits — which makes the kernel kill everything left in the pid namespace,
daemonised or double-forked descendants included. It also exits when its owner goes away (the
lifeline pipe reaches EOF), so nothing outlives the process that asked for it.

Confinement belongs to a thread: a starter thread of pid 1 applies the layers in order —
Landlock, capability drop, seccomp — and spawns the command (vfork and exec, no copy of pid 1),
which inherits exactly those, the launch's rlimits, and none of pid 1's descriptors but its
stdio, with the closed environment. pid 1's main thread stays outside the command's Landlock
domain, so the command cannot signal it (see _Starter).

A spare may be prepared for a view (see launcher.view_frame) before its launch exists: pid 1
builds the mounts and its starter confines itself, and the launch only brings what is its own
(argv, environment, working directory, umask, stdio). The zygote hands such a spare
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
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from stockade.errors import SetupError, StartError, StockadeError
from stockade.launch.request import LaunchRequest
from stockade.linux import fdpass, landlock, limits, mnt, net, privilege, reaper, seccomp
from stockade.linux.launcher import LAUNCH_FDS, VIEW_MAX, parse_frame, read_frame, view_frame
from stockade.linux.syscalls import prctl
from stockade.net.env import SANDBOX_PORT

PR_SET_DUMPABLE = 4
STAGE = "/tmp"          # any existing directory: the new root is mounted over it privately
START_ERRNOS = (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EPERM)
# Signals the command gets at their default: pid 1 (a Python process) ignores these.
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM)
DEVICE_GRANTS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/tty", "/dev/pts")


def emit(fd: int, **event: object) -> None:
    """Write one JSON-line event to the owner's status pipe."""
    os.write(fd, json.dumps(event).encode() + b"\n")


def stage(fd: int, name: str) -> None:
    """Mark the end of a launch stage (CLOCK_MONOTONIC is shared by all processes)."""
    emit(fd, event="stage", name=name, t=time.monotonic())


def serve(handoff: socket.socket, program: int | None) -> NoReturn:
    """Body of pid 1: wait for a view to prepare or one launch's descriptors, then run it.
    Never returns. `program` is the reaper's sealed memfd (reaper.py), if it was built.

    Its lifetime is bound to the zygote while it waits (the handoff socket closes) and to the
    owner once it runs a launch (the lifeline closes)."""
    prctl(PR_SET_DUMPABLE, 0)
    socket.sethostname("stockade")
    # pid 1's own standard streams are /dev/null: the command's reach it only as descriptors
    # it hands on, so their readers see the end when the command (and what it started) ends.
    null = os.open(os.devnull, os.O_RDWR)
    for target in range(3):
        os.dup2(null, target)
    os.close(null)
    message, fds = fdpass.recv_fds(handoff, LAUNCH_FDS, size=VIEW_MAX + 1)
    made = None
    if message.startswith(b"V") and not fds:
        made = _prepare(message[1:], handoff)
        message, fds = fdpass.recv_fds(handoff, LAUNCH_FDS)
    if len(fds) != LAUNCH_FDS:
        fdpass.close_all(fds)
        os._exit(0)  # the zygote is gone: nobody will ever use this sandbox
    *stdio, request_fd, status_fd, control_fd = fds
    stage(status_fd, "handoff")
    if os.getpid() != 1:
        _fail(status_fd, "setup", "setup_failed", "the sandbox's init is not pid 1 of a pid "
              "namespace of its own", "namespaces")
    try:
        raw, bpf, weaken, umask = parse_frame(read_frame(request_fd))
        request = LaunchRequest.decode(raw)
    except (StockadeError, EOFError, OSError) as exc:
        _fail(status_fd, "setup", "request_invalid", str(exc), "request")
    if made is not None and view_frame(request, bpf, weaken) != made.view:
        _fail(status_fd, "setup", "setup_failed", "the prepared sandbox was made for another "
              "view than this launch's", "request")
    stage(status_fd, "request")
    prepared_ahead = made is not None
    try:
        if made is None:
            made = _make(request, bpf, weaken, status_fd=status_fd,
                         mounted=lambda: _tell_mounted(handoff))
        else:
            handoff.close()
            stage(status_fd, "mounts")
            stage(status_fd, "confine")
        _pass_listener(made, control_fd)
        command = _start(made.starter, request, weaken, umask, stdio)
    except StockadeError as exc:
        _fail(status_fd, _kind(exc), exc.code, exc.message, getattr(exc, "stage", ""))
    except OSError as exc:
        _fail(status_fd, "setup", "setup_failed", f"{exc.strerror} ({exc.filename or ''})",
              "mount")
    enforced: dict[str, object] = {"weakened_for_testing": sorted(weaken)} if weaken else {}
    enforced |= {
        "namespaces": ["user", "mnt", "pid", "ipc", "uts", "net", "cgroup"],
        "landlock": landlock.describe(),
        "seccomp": {"mode": "filter", "denied_syscalls": len(seccomp.DENIED_SYSCALLS),
                    "clone3": "ENOSYS", "ioctl": "TIOCSTI/TIOCLINUX denied"},
        "protected_mounts": len(made.protected),
        "pid_max": made.pid_max,
        "limits": limits.describe(request.limits),
        "prepared_ahead": prepared_ahead,
    }
    stage(status_fd, "exec")
    emit(status_fd, event="started", enforced=enforced)
    code, sig = _supervise(command, request_fd, status_fd, program)
    stage(status_fd, "run")
    _drain()
    # Only now, with pid 1 alone in the sandbox: the owner may settle on this event without
    # waiting for pid 1 itself to exit (and the kernel to tear the namespaces down).
    emit(status_fd, event="exit", exit_code=code, signal=sig)
    os.close(status_fd)  # the owner's end sees EOF now, not after our address space is freed
    os._exit(0)


class _Made:
    """A sandbox made for a view: its mounts built, its confined starter thread waiting, and
    the proxy's listener when the network is an allowlist."""

    def __init__(self, view: bytes, protected: list[str], pid_max: int | None,
                 identity: bytes, listener: socket.socket | None, starter: _Starter) -> None:
        self.view, self.protected, self.pid_max = view, protected, pid_max
        self.identity, self.listener, self.starter = identity, listener, starter


class _Starter(threading.Thread):
    """The thread of pid 1 that starts the command. Landlock, the capability sets,
    no_new_privs and seccomp all belong to a thread, not a process: this thread confines
    itself (ahead of the launch), and the command it spawns inherits exactly that. pid 1's
    main thread stays outside the command's Landlock domain, which is what keeps the command
    from signalling it (Landlock's signal scope)."""

    def __init__(self, view: LaunchRequest, bpf: bytes, weaken: frozenset[str]) -> None:
        super().__init__(name="starter", daemon=True)
        self._confinement = (view, bpf, weaken)
        self._confined, self._asked, self._answered = (threading.Event() for _ in range(3))
        self._launch: tuple[LaunchRequest, list[int], bool] | None = None
        self._pid = 0
        self._error: BaseException | None = None
        self.start()
        self._confined.wait()
        if self._error is not None:
            raise self._error

    def run(self) -> None:
        try:
            _confine(*self._confinement)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
        self._confined.set()
        if self._error is not None:
            return
        self._asked.wait()
        assert self._launch is not None
        try:
            self._pid = _spawn(*self._launch)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
        self._answered.set()
        # Park until pid 1 exits (os._exit ends every thread): a thread's own exit (its stack
        # unmapped, the GIL handed over) cost the launch about 0.4 ms here.
        threading.Event().wait()

    def spawn(self, request: LaunchRequest, stdio: list[int], fork: bool) -> int:
        """Start the command from this (confined) thread; its pid."""
        self._launch = (request, stdio, fork)
        self._asked.set()
        self._answered.wait()
        if self._error is not None:
            raise self._error
        return self._pid


def _prepare(view: bytes, handoff: socket.socket) -> _Made:
    """Make the sandbox for a view before any launch, then tell the zygote the identity of
    what was mounted (see mnt.Survey.identity). Whatever fails here, this spare just ends:
    nobody is waiting for it, and a launch that needs this view gets a fresh sandbox that
    reports the failure."""
    try:
        if os.getpid() != 1:
            os._exit(0)
        raw, bpf, weaken, _ = parse_frame(view)
        made = _make(LaunchRequest.decode(raw), bpf, weaken, view)
        handoff.send(b"M" + made.identity)
    except BaseException:  # noqa: BLE001 - see above
        os._exit(0)
    return made


def _make(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], view: bytes = b"",
          status_fd: int = -1, mounted: Callable[[], None] = lambda: None) -> _Made:
    """The proxy's listener, pid_max, the mounts, then the confined thread that will start the
    command (Landlock, capability drop, seccomp). Nothing here depends on a launch's own argv,
    environment or working directory. `view` is the view frame it is made for, if made ahead."""
    listener = None
    if request.network.mode == "allowlist":
        try:
            listener = net.proxy_listener(SANDBOX_PORT)
        except OSError as exc:
            raise SetupError("proxy_listen_failed", exc.strerror or str(exc),
                             stage="network") from None
    pid_max = limits.cap_pid_namespace(request.limits)
    protected, identity = mnt.build(request, STAGE, weaken, identify=bool(view))
    if status_fd >= 0:
        stage(status_fd, "mounts")
    mounted()
    starter = _Starter(request, bpf, weaken)
    if status_fd >= 0:
        stage(status_fd, "confine")
    return _Made(view, protected, pid_max, identity, listener, starter)


def _confine(view: LaunchRequest, bpf: bytes, weaken: frozenset[str]) -> None:
    """Landlock, capability drop and seccomp, on the calling thread, from the view alone."""
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
    except StockadeError as exc:
        raise SetupError(exc.code, exc.message, stage=step) from None
    except OSError as exc:
        raise SetupError(f"{step}_failed", exc.strerror or str(exc), stage=step) from None


def _pass_listener(made: _Made, control_fd: int) -> None:
    """Hand the proxy's listener to the owner, whose proxy serves on it."""
    with socket.socket(fileno=control_fd) as control:
        if made.listener is not None:
            with made.listener:
                try:
                    fdpass.send_fds(control, b"P", [made.listener.fileno()])
                except OSError as exc:
                    raise SetupError("proxy_listen_failed", exc.strerror or str(exc),
                                     stage="network") from None


def _start(starter: _Starter, request: LaunchRequest, weaken: frozenset[str], umask: int,
           stdio: list[int]) -> int:
    """Start the command; its pid. In its working directory, with the launch's umask, its
    stdio, a session of its own, default signals and the rlimits. rlimits belong to a whole
    process: pid 1 takes them on itself and its starter spawns without copying pid 1 (vfork
    and exec), unless the memory limit is too small for pid 1 to live under; then the
    starter forks a child that takes them and execs."""
    try:
        os.chdir(request.cwd)
    except OSError as exc:
        raise SetupError("privilege_failed", exc.strerror or str(exc), stage="privilege") \
            from None
    os.umask(umask)
    privilege.cloexec_from(3)  # nothing of pid 1's but stdio reaches the command
    rlimits = "rlimits" not in weaken
    fork = rlimits and not limits.init_can_live_under(request.limits)
    if rlimits and not fork:
        limits.apply_rlimits(request.limits)
    try:
        return starter.spawn(request, stdio, fork)
    finally:
        fdpass.close_all(stdio)


def _spawn(request: LaunchRequest, stdio: list[int], fork: bool) -> int:
    """In the starter thread: the command's pid."""
    if fork:
        return _fork_exec(request, stdio)
    path = dict(request.env).get("PATH")
    if path is None:  # the search path posix_spawnp uses is pid 1's own
        os.environ.pop("PATH", None)
    else:
        os.environ["PATH"] = path
    try:
        return os.posix_spawnp(
            request.argv[0], list(request.argv), dict(request.env), setsid=True,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)],
            setsigdef=RESET_SIGNALS)
    except OSError as exc:
        raise _start_error(exc, "exec", request.argv[0]) from None


def _fork_exec(request: LaunchRequest, stdio: list[int]) -> int:
    """In the starter thread: fork a child that takes the rlimits and execs."""
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    command = os.fork()
    if command == 0:
        step = "privilege"
        try:
            os.setsid()
            for sig in RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            limits.apply_rlimits(request.limits)
            privilege.close_fds({0, 1, 2, report_w})
            step = "exec"
            os.execvpe(request.argv[0], list(request.argv), dict(request.env))
        except BaseException as exc:  # noqa: BLE001 - anything here must become a typed report
            error = _start_error(exc, step, request.argv[0])
            report = {"kind": _kind(error), "code": error.code, "message": error.message,
                      "stage": step}
            os.write(report_w, json.dumps(report).encode())
        os._exit(127)
    os.close(report_w)
    failure = _read_all(report_r)
    if failure:
        os.waitpid(command, 0)
        info = json.loads(failure)
        if info["kind"] == "start":
            raise StartError(info["code"], info["message"])
        raise SetupError(info["code"], info["message"], stage=info["stage"])
    return command


def _start_error(exc: BaseException, step: str, argv0: str) -> StockadeError:
    """Why the command could not start, typed."""
    if isinstance(exc, OSError) and step == "exec" and exc.errno in START_ERRNOS:
        code = "command_not_found" if exc.errno == errno.ENOENT else "command_not_executable"
        return StartError(code, f"{argv0}: {exc.strerror}")
    if isinstance(exc, OSError):
        return SetupError(f"{step}_failed", exc.strerror or str(exc), stage=step)
    if isinstance(exc, StockadeError):
        return SetupError(exc.code, exc.message, stage=step)
    return SetupError("internal_error", exc.__class__.__name__, stage=step)


def _kind(error: StockadeError) -> str:
    return "start" if isinstance(error, StartError) else "setup"


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


def _fail(status_fd: int, kind: str, code: str, message: str, where: str) -> NoReturn:
    emit(status_fd, event="error", kind=kind, code=code, message=message, stage=where)
    os._exit(70 if kind == "setup" else 71)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _supervise(child: int, lifeline_fd: int, status_fd: int, program: int | None
               ) -> tuple[int | None, int | None]:
    """Reap every child as it exits (orphans come to pid 1: left as zombies, they would count
    against the sandbox's process limit) until the command exits; die at once if the owner
    disappears. A command still running after reaper.GRACE gets the small pid 1, which
    carries on from here."""
    woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (a handler: SIGCHLD then wakes `woken`)
    poller = select.poll()
    poller.register(woken, select.POLLIN)
    poller.register(lifeline_fd, select.POLLIN | select.POLLHUP)
    deadline = None if program is None else time.monotonic() + reaper.GRACE
    while (status := _reap(child)) is None:
        ready = poller.poll(None if deadline is None
                            else max(0.0, deadline - time.monotonic()) * 1000)
        if not ready and deadline is not None:
            reaper.become(program, child, lifeline_fd, status_fd)  # returns only if it failed
            deadline = None
        for fd, _ in ready:
            if fd == lifeline_fd:
                os._exit(1)  # owner gone: pid 1 exiting kills the whole namespace
            os.read(woken, 4096)
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


def _reap(child: int) -> int | None:
    """Reap every child that has exited; the command's wait status once it is among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = status


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
