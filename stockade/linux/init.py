"""The sandbox's pid 1, first half: it builds the filesystem view, confines itself, and becomes
the supervisor (supervisor.c), which starts the command, reaps every orphan, and exits as soon
as the command exits — which makes the kernel kill everything left in the pid namespace,
daemonised or double-forked descendants included. The supervisor also exits when its owner
goes away (the lifeline pipe reaches EOF), so nothing outlives the process that asked for it.

pid 1 applies the layers to itself in order — Landlock, capability drop, seccomp — and the
supervisor and the command it forks inherit exactly those. The command then gets a Landlock
domain of its own nested inside pid 1's, which restricts it no further but keeps pid 1 out of
its reach (no signal, no trace; see landlock.nested_domain). pid 1 holds no capability and is
not dumpable either.

A spare may be prepared for a view (see frame.view_frame) before its launch exists: pid 1
builds the mounts ("V", from the CLI's ForkSpawner; the zygote's spares are cloned from a view
template instead, see template.py), confines itself and becomes the supervisor ahead of
demand, and the launch only brings what is its own (argv, environment, working directory,
umask, stdio). Such a spare goes only to a launch with the same view frame whose fresh survey
of the host has the same identity (mnt.Survey.identity); the supervisor checks the view
frame's digest again.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import NoReturn

from stockade.errors import SetupError, StockadeError
from stockade.launch.request import LaunchRequest
from stockade.linux import fdpass, landlock, limits, mnt, net, privilege, seccomp, supervisor
from stockade.linux.frame import LAUNCH_FDS, VIEW_MAX, parse_frame, read_frame, switched_off
from stockade.linux.syscalls import prctl
from stockade.net.env import SANDBOX_PORT
from stockade.policy.model import protected_whole

PR_SET_DUMPABLE = 4
STAGE = "/tmp"          # any existing directory: the new root is mounted over it privately
DEVICE_GRANTS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/tty", "/dev/pts")


def emit(fd: int, **event: object) -> None:
    """Write one JSON-line event to the owner's status pipe."""
    os.write(fd, json.dumps(event).encode() + b"\n")


def stage(fd: int, name: str) -> None:
    """Mark the end of a launch stage (CLOCK_MONOTONIC is shared by all processes)."""
    emit(fd, event="stage", name=name, t=time.monotonic())


def serve(handoff: socket.socket, program: int | None) -> NoReturn:
    """Body of pid 1: wait for a view to prepare or one launch's descriptors, make the sandbox
    and become the supervisor. Never returns. `program` is the supervisor's sealed memfd
    (supervisor.py), None if it was not built.

    Its lifetime is bound to the zygote while it waits (the handoff socket closes) and to the
    owner once it runs a launch (the lifeline closes)."""
    settle_as_pid1()
    message, fds = fdpass.recv_fds(handoff, LAUNCH_FDS, size=VIEW_MAX + 1)
    if message.startswith(b"V") and not fds and program is not None:
        _prepare(message[1:], handoff, program)
    if len(fds) != LAUNCH_FDS:
        fdpass.close_all(fds)
        os._exit(0)  # the zygote is gone: nobody will ever use this sandbox
    status_fd = fds[4]
    stage(status_fd, "handoff")
    if program is None:
        _fail(status_fd, "setup", "supervisor_not_built", supervisor.MISSING, "launcher")
    try:
        raw, bpf, weaken, launch = parse_frame(read_frame(fds[3]))
        request = LaunchRequest.decode(raw)
    except (StockadeError, EOFError, OSError) as exc:
        _fail(status_fd, "setup", "request_invalid", str(exc), "request")
    if os.getpid() != 1 and "pid_namespace" not in weaken:
        _fail(status_fd, "setup", "setup_failed", "the sandbox's init is not pid 1 of a pid "
              "namespace of its own", "namespaces")
    stage(status_fd, "request")
    try:
        plan, listener, _ = _make(request, bpf, weaken, launch, status_fd=status_fd,
                                  mounted=lambda: _tell_mounted(handoff), control=fds[5])
        supervisor.become(program, plan, listener, launch_fds=fds)
    except StockadeError as exc:
        _fail(status_fd, "setup", exc.code, exc.message, getattr(exc, "stage", ""))
    except OSError as exc:
        _fail(status_fd, "setup", "setup_failed", f"{exc.strerror} ({exc.filename or ''})",
              "mount")


def settle_as_pid1() -> None:
    """What a sandbox's pid 1 does first (a spare cloned from a view template does the same
    in template.c's settle): not dumpable, its own hostname, and /dev/null as its standard
    streams, so that the command's reach it only as descriptors it hands on and their readers
    see the end when the command (and what it started) ends."""
    prctl(PR_SET_DUMPABLE, 0)
    socket.sethostname("stockade")
    null = os.open(os.devnull, os.O_RDWR)
    for target in range(3):
        os.dup2(null, target)
    os.close(null)


def _prepare(view: bytes, handoff: socket.socket, program: int) -> NoReturn:
    """Make the sandbox for a view before any launch, tell the zygote the identity of what was
    mounted (see mnt.Survey.identity), and become the supervisor, waiting for the launch.
    Whatever fails here, this spare just ends: nobody is waiting for it, and a launch that
    needs this view gets a fresh sandbox that reports the failure."""
    try:
        if os.getpid() != 1:
            os._exit(0)
        raw, bpf, weaken, _ = parse_frame(view)
        plan, listener, identity = _make(LaunchRequest.decode(raw), bpf, weaken, b"", view)
        handoff.send(b"M" + identity)
        supervisor.become(program, plan, listener, handoff=handoff.fileno())
    except BaseException:  # noqa: BLE001 - see above
        os._exit(0)


def _make(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], launch: bytes,
          view: bytes = b"", status_fd: int = -1, mounted: Callable[[], None] = lambda: None,
          control: int = -1) -> tuple[int, int | None, bytes]:
    """The proxy's listener, pid_max and memfd_noexec, the mounts, the supervisor's plan, then
    pid 1 confined (Landlock, capability drop, seccomp): (plan, listener, identity). Nothing
    here depends on a launch's own argv, environment or working directory. `view` is the view
    frame it is made for, if made ahead: only then is the survey's identity (see mnt.build)
    not empty. `control` is the owner's control socket (network "any" needs it: never made
    ahead)."""
    if request.network.mode == "any" and "network" not in weaken:
        if control < 0:
            raise SetupError("network_setup_failed", 'network "any" is not made ahead',
                             stage="network")
        resolv_conf = net.open_out(control, forwarded="usernet_isolation" in weaken)
        if status_fd >= 0:
            stage(status_fd, "network")
    else:
        resolv_conf = None
    listener = listener_for(request)
    knobs = limits.pid_knobs(request, weaken)
    limits.set_pid_knobs(knobs)
    protected, identity = mnt.build(request, STAGE, weaken, identify=bool(view),
                                    resolv_conf=resolv_conf)
    if status_fd >= 0:
        stage(status_fd, "mounts")
    mounted()
    plan = seal(request, bpf, weaken, len(protected), knobs, view, launch)
    if status_fd >= 0:
        stage(status_fd, "confine")
    return plan, listener, identity


def listener_for(request: LaunchRequest) -> int | None:
    """The proxy's listener on the sandbox's loopback, when the network is an allowlist."""
    if request.network.mode != "allowlist":
        return None
    try:
        return net.proxy_listener(SANDBOX_PORT).detach()
    except OSError as exc:
        raise SetupError("proxy_listen_failed", exc.strerror or str(exc),
                         stage="network") from None


def seal(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], protected: int,
         knobs: limits.PidKnobs, view: bytes, launch: bytes) -> int:
    """Once the mounts are made: the supervisor's plan (a memfd), then pid 1 confined."""
    plan = plan_for(request, weaken, protected, knobs, view, launch)
    _confine(request, bpf, weaken)
    return plan


def plan_for(request: LaunchRequest, weaken: frozenset[str], protected: int,
             knobs: limits.PidKnobs, view: bytes, launch: bytes) -> int:
    """The supervisor's plan (supervisor.plan) for a sandbox of `request`: made ahead for
    `view` (a view frame), or for this `launch`."""
    enforced = _enforced(request, weaken, protected, knobs, prepared_ahead=bool(view))
    nested = (0, 0) if "landlock" in weaken else landlock.nested_domain()
    return supervisor.plan(request.limits, "rlimits" not in weaken,
                           limits.memory_watched(request.limits, weaken), nested, enforced,
                           hashlib.sha256(view).digest() if view else None, launch,
                           bound="lifeline" not in weaken,
                           close_fds="descriptors" not in weaken,
                           written=written_paths(request) if exec_watched(request, weaken)
                           else None, seal_memfd=memfd_sealed(request, weaken),
                           names=watched_names(request, weaken) or None,
                           free=scratch_paths(request),
                           proc_guard="proc_guard" not in weaken)


def exec_watched(request: LaunchRequest, weaken: frozenset[str] = frozenset()) -> bool:
    """Whether pid 1 refuses the command's executable mappings and executions of written files
    (memwatch.c): where exec_from_write = false, beside the noexec mounts, where seccomp user
    notification is. The "exec_watch", "seccomp" and "mount_view" weakenings (tests only)
    take it away (without the view, the write roots are no mounts of their own)."""
    return (not request.exec_from_write
            and not weaken & {"exec_watch", "seccomp", "mount_view"}
            and seccomp.user_notification_available())


def memfd_sealed(request: LaunchRequest, weaken: frozenset[str] = frozenset()) -> bool:
    """Whether pid 1 makes the command's memfds itself, sealed non-executable (memwatch.c):
    where exec_from_write = false, seccomp user notification is and the kernel has
    MFD_NOEXEC_SEAL (6.3). The "memfd_seal" and "seccomp" weakenings (tests only) take it
    away."""
    return (not request.exec_from_write and not weaken & {"memfd_seal", "seccomp"}
            and seccomp.user_notification_available() and limits.memfd_noexec_seal())


GIT_MAKES = frozenset({".git", ".gitmodules"})  # protected names git itself makes, not watched


def watched_names(request: LaunchRequest, weaken: frozenset[str] = frozenset()
                  ) -> tuple[str, ...]:
    """The protected names pid 1 keeps the command from making (namewatch.c), lower case: every
    name protected whole but those git makes in its work (`.git`: git init; the git guard
    covers it at the next launch; `.gitmodules`: a checkout of a tree holding one, as `git
    worktree add` or `git clone` of a repository with submodules makes); none where the
    "names_watch", "protected" (or "mount_view", which takes it) or "seccomp" weakenings (tests
    only) take the watch away, where there is no write root or no seccomp user notification;
    and the names in write roots the command may not make (request.unmade,
    "directory/name")."""
    off = switched_off(weaken)
    # (with both "landlock" and "privileges" off, rootless, the starter holds neither
    # no_new_privs nor CAP_SYS_ADMIN, which installing the watch's filter needs: EACCES. Setting
    # no_new_privs for it would do those layers' work and hide what the switches must show (the
    # proc.capabilities row then held with both off), so that test-only sandbox has no watch)
    if off & {"names_watch", "protected", "seccomp"} or {"landlock", "privileges"} <= off \
            or not request.write or not seccomp.user_notification_available():
        return ()
    whole = protected_whole(request.protected, request.git, guards_git=True)
    return tuple(sorted({name.lower() for name in whole} - GIT_MAKES)) + request.unmade


def scratch_paths(request: LaunchRequest) -> tuple[str, ...]:
    """The sandbox's own scratch mounts, where a protected name may be made: /tmp and /dev/shm,
    unless a write root is one of them."""
    return tuple(path for path in ("/tmp", "/dev/shm")
                 if path not in {grant.path for grant in request.write})


def written_paths(request: LaunchRequest) -> tuple[str, ...]:
    """What the command may write, as it sees it: its write roots, /tmp and /dev/shm."""
    return (*(g.path for g in request.write), "/tmp", "/dev/shm")


def _enforced(request: LaunchRequest, weaken: frozenset[str], protected: int,
              knobs: limits.PidKnobs, *, prepared_ahead: bool) -> dict[str, object]:
    """What the result reports as enforced (the "started" event)."""
    enforced: dict[str, object] = {"weakened_for_testing": sorted(weaken)} if weaken else {}
    if request.host_code:  # (what a write there meets EROFS for: the result says why)
        enforced["host_code_read_only"] = list(request.host_code)
    if request.home_code:  # (the home's: launch/homecode.py)
        enforced["home_code_read_only"] = list(request.home_code)
    return enforced | {
        "namespaces": ["user", "mnt", "pid", "ipc", "uts", "net", "cgroup"],
        "landlock": landlock.describe(),
        "seccomp": {"mode": "filter", "denied_syscalls": len(seccomp.DENIED_SYSCALLS),
                    "clone3": "ENOSYS", "ioctl": "TIOCSTI/TIOCLINUX denied"},
        "protected_mounts": protected,
        "pid_max": knobs.pid_max,
        "memfd_noexec": knobs.memfd_noexec,
        "exec_watch": exec_watched(request, weaken),
        "memfd_seal": memfd_sealed(request, weaken),
        "protected_names_watched": bool(watched_names(request, weaken)),
        "limits": limits.describe(request.limits, weaken),
        "prepared_ahead": prepared_ahead,
    }


def _confine(view: LaunchRequest, bpf: bytes, weaken: frozenset[str]) -> None:
    """Landlock, capability drop and seccomp, on pid 1 itself, from the view alone."""
    confine_layers(lambda: landlock.ruleset(landlock_rules(view)), bpf, weaken)


def confine_layers(ruleset: Callable[[], landlock.Ruleset], bpf: bytes,
                   weaken: frozenset[str]) -> None:
    """Securebits, Landlock (`ruleset`), capability drop and seccomp (`bpf`) on this process,
    in that order, but for what `weaken` (tests only) switches off; SetupError naming the
    step that failed (a landlock-tier command is confined the same way)."""
    step = "privilege"
    try:
        if "privileges" not in weaken:
            privilege.prepare()
        step = "landlock"
        if "landlock" not in weaken:
            landlock.restrict(ruleset())
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


def landlock_rules(request: LaunchRequest) -> landlock.LandlockRules:
    """The Landlock rules of a sandbox of `request`, its paths as the sandbox sees them."""
    return landlock.LandlockRules(
        read=tuple(g.path for g in request.read),
        browse=("/proc", "/dev"),
        write=written_paths(request),
        devices=DEVICE_GRANTS,
        exec_from_write=request.exec_from_write,
        deny_tcp=request.network.mode in ("none", "allowlist"),
        scope=True,
        tcp_connect_ports=(SANDBOX_PORT,) if request.network.mode == "allowlist" else (),
    )
