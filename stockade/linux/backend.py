"""LinuxBackend: the Backend contract on Linux (namespaces, mounts, Landlock, seccomp, rlimits)."""

from __future__ import annotations

import copy
import fcntl
import functools
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from stockade.errors import (
    SetupError,
    StartError,
    UnavailableError,
    UnenforceableError,
)
from stockade.launch import hostcode
from stockade.launch.backend import (
    Backend,
    Capability,
    Exit,
    Handle,
    Stdio,
    refuse_other_containment,
)
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Violation, network_denials
from stockade.linux import landlock, limits, mnt, seccomp, supervisor, zygote
from stockade.linux.fdpass import recv_fds
from stockade.linux.frame import WEAKENINGS, encode_frame, encode_launch, view_frame
from stockade.linux.hints import hint
from stockade.linux.launcher import Shape

if TYPE_CHECKING:
    from stockade.launch.probe import Attestation
    from stockade.launch.report import Row
    from stockade.linux.probe import LinuxProbe
    from stockade.net.approve import Approval
    from stockade.net.authority import Authority
    from stockade.net.gate import Dialer
    from stockade.net.inspect import Inspector
    from stockade.net.proxy import Proxy

_SYSTEM_PREFIXES = ("/proc", "/dev")


def _seccomp_program(unix_sockets: bool = True) -> bytes:
    return _compiled_filter(unix_sockets)


@functools.cache
def _compiled_filter(unix_sockets: bool) -> bytes:
    """(Cached by value: the probe's `_seccomp_program()` and a launch's
    `_seccomp_program(True)` are one compilation, not two.)"""
    return seccomp.compile_filter(unix_sockets)


class LinuxBackend(Backend):
    """`weaken` switches layers off (frame.LAYERS), for tests that prove the evidence
    matrix can fail; it is a constructor argument only, never read from the environment or a
    policy. `resolver` and `dialer` stand in for the allowlist proxy's DNS and connections
    (tests, and the evidence rows that need a name to resolve to an address no test may
    reach); `upstream_ca`, a CA file, for the system trust store the proxy verifies
    intercepted hosts with (tests: a server of their own)."""

    name = "linux"
    overlay_workspace = True  # filesystem.workspace = "overlay" (stockade/linux/overlay.py)

    def __init__(self, weaken: frozenset[str] = frozenset(),
                 resolver: Callable[[str], list[str]] | None = None,
                 dialer: Dialer | None = None, upstream_ca: str | None = None) -> None:
        unknown = weaken - WEAKENINGS
        if unknown:
            raise ValueError(f"unknown weakening {sorted(unknown)[0]!r}")
        self.weaken = frozenset(weaken)
        self.resolver = resolver  # for tests: the proxy's name resolution, host -> addresses
        self.dialer = dialer      # for tests: the proxy's connection to checked addresses
        self.upstream_ca = upstream_ca
        self.approval: Approval | None = None  # (with_approval)

    def weakened(self, layers: frozenset[str]) -> LinuxBackend:
        """This backend (or tier) with `layers` switched off too (tests: the evidence's
        controls)."""
        return type(self)(self.weaken | layers, self.resolver, self.dialer, self.upstream_ca)

    def with_stand_ins(self, resolver: Callable[[str], list[str]] | None,
                       dialer: Dialer | None, upstream_ca: str | None = None) -> LinuxBackend:
        """This backend (or tier), its proxy resolving and connecting through stand-ins (and
        verifying intercepted hosts with `upstream_ca`, if given)."""
        return type(self)(self.weaken, resolver, dialer, upstream_ca or self.upstream_ca)

    def with_approval(self, approval: Approval | None) -> LinuxBackend:
        """This backend (or tier), its allowlist proxy asking `approval` about destinations
        outside network.allow (stockade/net/approve.py)."""
        other = copy.copy(self)
        other.approval = approval
        return other

    def probe(self) -> None:
        if not sys.platform.startswith("linux"):
            raise UnavailableError("backend_unavailable", "the Linux backend runs only on Linux")
        for knob, bad, why in USERNS_KNOBS:
            if _read(knob) == bad and not (os.getuid() == 0 and "unprivileged" in knob):
                raise UnavailableError("userns_unavailable", hint(f"{why} ({knob} = {bad})"))
        if landlock.abi_version() == 0:
            raise UnavailableError("landlock_unsupported",
                                   hint("this kernel has no Landlock, or it is disabled"))
        _seccomp_program()  # raises seccomp_unavailable without libseccomp
        if not supervisor.built():
            raise UnavailableError("supervisor_not_built", hint(supervisor.MISSING))

    def check(self, request: LaunchRequest) -> None:
        refuse_other_containment(request, self.name, "native")
        if request.network.mode == "any":
            _usernet().check(request)
        if request.limits.cpu is not None:
            raise UnenforceableError(
                "limits.cpu", "a CPU rate needs a delegated cgroup v2 cpu controller, "
                "which this host does not offer")
        for grant in request.read + request.write:
            if any(grant.path == p or grant.path.startswith(p + "/") for p in _SYSTEM_PREFIXES):
                raise UnenforceableError(
                    "filesystem.system_path",
                    f"{grant.path}: the sandbox provides its own /proc and /dev")

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> LinuxHandle:
        if request.isolation != "namespaces":  # (only its tier, `tier`, launches those)
            raise UnenforceableError("isolation", f"isolation {request.isolation!r} is "
                                     "launched by the backend's tier of that name")
        request = self._tested(request)
        return LinuxHandle(request, stdio,
                           _seccomp_program(request.network.unix_sockets != "none"),
                           self.weaken, self.resolver, self.dialer, self.upstream_ca,
                           self.approval)

    def _tested(self, request: LaunchRequest) -> LaunchRequest:
        """`request` as the test-only weakenings that act on it leave it."""
        if "stockade_state" in self.weaken:  # (Stockade's own state left visible)
            request = _without_stockade_state(request)
        if "host_code" in self.weaken:  # (the host's code left writable)
            request = replace(request, host_code=(), home_code=(), unmade=())
        if "environment" in self.weaken:  # (the launching process's environment)
            request = replace(request, env=tuple(sorted(os.environ.items())))
        return request

    def tier(self, isolation: str) -> Backend:
        """This backend's sandboxes isolated as `isolation` asks (policy.model.ISOLATIONS)."""
        if isolation == "namespaces":
            return self
        return LandlockTier(self.weaken, self.resolver, self.dialer, self.upstream_ca)

    def readiness_probe(self) -> LinuxProbe:
        from stockade.linux.probe import LinuxProbe

        return LinuxProbe()

    def report_rows(self, attestation: Attestation) -> tuple[Row, ...]:
        from stockade.linux.report import rows

        return rows(attestation, self)

    def report(self) -> list[Capability]:
        abi = landlock.abi_version()
        uid = os.getuid()
        noexec = limits.may_set_memfd_noexec()
        watched = seccomp.user_notification_available()
        memfd = noexec or watched
        return [
            Capability("namespaces", True, "user, mnt, pid, ipc, uts, net, cgroup",
                       "rootless" if uid else "as root: uid 0 mapped to itself, no capabilities"),
            Capability("filesystem.read", True, "read-only bind mounts + Landlock"),
            Capability("filesystem.write", True, "nosuid/nodev bind mounts + Landlock"),
            Capability("filesystem.deny", True, "mode-000 masks mounted over the path"),
            Capability("filesystem.protected", True,
                       "read-only re-mounts of every existing occurrence; ancestors pinned"),
            Capability("filesystem.git", True, "read-only re-mounts of each repository's "
                       "config and includes, hooks and gitdir pointers; ancestors pinned",
                       "what the command creates (a repository, a commondir) is its own"),
            Capability("filesystem.exec_from_write", True,
                       "noexec mounts + Landlock EXECUTE"
                       + (" + pid 1 refuses executable mappings of written files"
                          if seccomp.user_notification_available() else "")),
            Capability("filesystem.memfd_exec", memfd, " + ".join(
                           (["vm.memfd_noexec = 2 in the sandbox's pid namespace"] if noexec
                            else [])
                           + ([limits.MEMFD_WATCH] if watched else [])) or "not prevented",
                       "" if memfd else "only host root may set vm.memfd_noexec, and this "
                       "kernel has no seccomp user notification: a memfd the command writes "
                       "can be executed"),
            Capability("filesystem.metadata", True, "read-only mounts: files outside the "
                       "write roots keep their mode and times"),
            Capability("host_processes", True, "a pid namespace of its own"),
            Capability("filesystem.privilege_bits", True, "seccomp: no setuid/setgid mode bit "
                       "by chmod, open, mknod (openat2 -> ENOSYS); no CAP_SETFCAP"),
            Capability("filesystem.host_code", True, "the code the host runs next (Stockade's "
                       "install, the interpreter, its import path) re-mounted read-only where "
                       "it lies in a write root; ancestors pinned"),
            Capability("stockade_state", True, "Stockade's state directories masked in every "
                       "view; the daemon and CLI server serve no peer in another context",
                       "peers known by SO_PEERPIDFD and their own /proc"),
            Capability("stdio", True, "pipes relayed by the owner",
                       "no terminal or file of the caller's enters the sandbox"),
            Capability("landlock", abi > 0, f"ABI {abi}"),
            Capability("seccomp", True, "libseccomp filter", f"{len(seccomp.DENIED_SYSCALLS)} "
                       "syscalls denied, clone3 and openat2 -> ENOSYS, TIOCSTI/TIOCLINUX "
                       "denied, sockets of unix/inet/inet6/netlink only"),
            Capability("network.none", True, "empty network namespace + Landlock TCP"),
            Capability("network.allowlist", True,
                       "empty network namespace; the owner's proxy listens on the sandbox's "
                       "loopback; Landlock allows TCP connect to that port only",
                       "TCP only (HTTP CONNECT, plain HTTP, SOCKS5); no UDP"),
            _usernet().capability(),
            Capability("limits.memory", True, "RLIMIT_AS",
                       "per process, not per tree" + (
                           "; mmap/mremap requests refused at the limit are reported "
                           "(limits.memory violations)" if seccomp.user_notification_available()
                           else "; refusals are not reported here (no seccomp user "
                           "notification)")),
            Capability("limits.pids", True,
                       "pid_max of the sandbox pid namespace" if uid == 0 else "RLIMIT_NPROC",
                       "at most pids + 300 when run as root" if uid == 0 else "exact"),
            Capability("limits.cpu", False, "needs a delegated cgroup v2 cpu controller"),
            Capability("limits.file_size", True, "RLIMIT_FSIZE"),
            Capability("limits.timeout", True, "wall clock; the pid namespace is torn down"),
            Capability("kill_on_close", True, "pid-namespace init bound to the owner's lifeline, "
                       "killed by the kernel when its parent (the zygote or the CLI) goes, and "
                       "by the owner through its pidfd when it does not end in time"),
        ]


# Host settings that forbid an unprivileged user namespace: (path, bad value, why).
USERNS_KNOBS = (
    ("/proc/sys/user/max_user_namespaces", "0", "user namespaces are disabled"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "0",
     "unprivileged user namespaces are disabled"),
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "AppArmor restricts unprivileged user namespaces"),
)


class LandlockTier(LinuxBackend):
    """The Linux backend without namespaces (`isolation = "landlock"`, landlock_tier.py):
    only ever chosen by the request, never as a fallback."""

    name = "linux-landlock"
    isolation = "landlock"
    overlay_workspace = False  # no mount namespace: no overlay

    def probe(self) -> None:
        if not sys.platform.startswith("linux"):
            raise UnavailableError("backend_unavailable", "the Linux backend runs only on Linux")
        _landlock_tier().require_landlock()
        _tier_seccomp_program(self.weaken)

    def check(self, request: LaunchRequest) -> None:
        landlock_tier = _landlock_tier()
        landlock_tier.check(request)  # (first: network any is refused before it is looked at)
        if "stockade_state" not in self.weaken:  # (tests only: a root may hold it)
            landlock_tier.refuse_state_in_roots(request)
        if "host_code" not in self.weaken:  # (tests only: the host's code left writable)
            hostcode.refuse_unkept(request, "the landlock tier (no mount view)",
                                   "or use isolation namespaces")
            if request.unmade:  # (Landlock rules hold paths that exist: none is made)
                raise UnenforceableError("filesystem.host_code", (
                    f"{request.unmade[0]} would be code this host runs outside the sandbox "
                    "(the home's configuration its shell, git or login reads; what an import "
                    "takes before a module the host imports; or a directory its import path "
                    "names, a relative entry joined to the working directory, as setuptools' "
                    "editable key __editable__.NAME.finder.__path_hook__ is, which the next "
                    "run imports from once made) and a write root holds where it would be "
                    "made, which the landlock tier cannot stop: run the program from a "
                    "directory outside the write roots, use isolation namespaces (which keep "
                    "the name unmade), or a write root that does not hold it"))
        super().check(request)

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> LinuxHandle:
        request = self._tested(request)
        return LinuxHandle(replace(request, isolation="landlock"), stdio,
                           _tier_seccomp_program(self.weaken), self.weaken, self.resolver)

    def tier(self, isolation: str) -> Backend:
        if isolation == "landlock":
            return self
        return LinuxBackend(self.weaken, self.resolver, self.dialer, self.upstream_ca)

    def report(self) -> list[Capability]:
        return _landlock_tier().capabilities()

    def readiness_probe(self) -> LinuxProbe:
        from stockade.linux.probe import LandlockTierProbe

        return LandlockTierProbe()

    def report_rows(self, attestation: Attestation) -> tuple[Row, ...]:
        from stockade.linux.report import tier_rows

        return tier_rows(attestation, self)


@functools.cache
def _tier_seccomp_program(weaken: frozenset[str]) -> bytes:
    return _landlock_tier().seccomp_program(weaken)


# The landlock tier, network "any" and its guard are imported only where they are used:
# `stockade run` starts faster without them.
def _landlock_tier() -> ModuleType:
    from stockade.linux import landlock_tier

    return landlock_tier


def _usernet() -> ModuleType:
    from stockade.linux import usernet

    return usernet


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


# What each of pid 1's events holds (supervisor.c, namewatch.c, init.py): field -> types.
# A record's "more" stands for all its other fields.
_NUMBER, _OPTIONAL_INT = (int, float), (int, type(None))
_EVENT_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "stage": {"name": (str,), "t": _NUMBER},
    "started": {"enforced": (dict,)},
    "exit": {"exit_code": _OPTIONAL_INT, "signal": _OPTIONAL_INT},
    "error": {"kind": (str,), "code": (str,), "message": (str,)},
    "protected_name": {"call": (str,), "directory": (str,), "name": (str,),
                       "protected": (str,)},
    "git_guarded": {"call": (str,), "directory": (str,), "name": (str,), "error": (str,)},
    "memory_refused": {"refused": (int,), "size": (int,), "in_use": (int,)},
}
_EVENT_OPTIONS: dict[str, dict[str, tuple[type, ...]]] = {
    "exit": {"memory": (dict,), "protected_unrecorded": (int,)},
    "error": {"stage": (str,)},
}
_WATCH_FIELDS = ("watched", "refused", "largest", "in_use")


def _event(line: bytes) -> dict | None:
    """`line` as one of pid 1's events, or None when it is not one (not JSON, of no known
    kind, a field missing or of another type)."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    kind = event.get("event") if isinstance(event, dict) else None
    fields = _EVENT_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return None
    options = _EVENT_OPTIONS.get(event["event"], {})
    if event.get("more") in (True, "true") and event["event"] in ("protected_name",
                                                                 "git_guarded"):
        return event
    if not all(isinstance(event.get(key), kinds) for key, kinds in fields.items()) or not all(
            isinstance(event[key], kinds) for key, kinds in options.items() if key in event):
        return None
    memory = event.get("memory")
    if memory is not None and not all(isinstance(memory.get(key), int) for key in _WATCH_FIELDS):
        return None
    return event


class StatusLines:
    """pid 1's status pipe, read as it comes: one JSON event a line. pid 1's own lines are
    few and small (some 20 stages, at most 3 x 101 records in 10 seconds, started, exit;
    started, the largest, some KiB): what is not one of its events (a line that is not one,
    longer than LINE_MAX, or past EVENTS_MAX events or KEPT_MAX bytes, but for a first end:
    exit or error) is ignored and counted, never a traceback nor memory without bound. (Only
    pid 1 holds the pipe's write end: these bounds are a second layer. A warm sandbox that
    lives long enough to pass them has its later records counted, as its commands' Results
    say: LinuxHandle.refusals.)"""

    LINE_MAX = 1 << 20
    EVENTS_MAX = 4096
    KEPT_MAX = 8 << 20

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.ignored = 0
        self._kept = 0  # bytes of the events kept
        self._ended = False  # an exit or error kept
        self._tail = b""  # the line begun, not yet ended
        self._skipping = False  # within a line past LINE_MAX: dropped to its end

    def feed(self, chunk: bytes) -> None:
        lines = chunk.split(b"\n")
        for i, line in enumerate(lines):
            ended = i < len(lines) - 1
            if self._skipping:
                self._skipping = not ended
                continue
            if len(self._tail) + len(line) > self.LINE_MAX:
                self.ignored += 1
                self._tail, self._skipping = b"", not ended
                continue
            self._tail += line
            if ended:
                self._take(self._tail)
                self._tail = b""

    def _take(self, line: bytes) -> None:
        if not line.strip():
            return
        event = _event(line)
        end = event is not None and event["event"] in ("exit", "error") and not self._ended
        if event is None or not end and (len(self.events) >= self.EVENTS_MAX
                                         or self._kept + len(line) > self.KEPT_MAX):
            self.ignored += 1
            return
        self.events.append(event)
        self._kept += len(line)
        self._ended |= end

    def ignored_violation(self, before: int = 0) -> Violation | None:
        """What the lines ignored (after the first `before`) say, if any (their count: never
        their words, which may be a hostile command's)."""
        if self.ignored <= before:
            return None
        return Violation("supervisor.status_ignored", f"{self.ignored - before} lines on the "
                         f"sandbox's "
                         f"status pipe were not its events (not JSON, of no known kind or "
                         f"shape, longer than {self.LINE_MAX} bytes, or past "
                         f"{self.EVENTS_MAX} events or {self.KEPT_MAX} bytes): ignored")


class LinuxHandle(Handle):
    """A launch in progress, in a skeleton from the zygote. The pidfd of the sandbox's pid 1
    tells when the whole sandbox has drained (pid 1 exits last)."""

    def __init__(self, request: LaunchRequest, stdio: Stdio, bpf: bytes,
                 weaken: frozenset[str] = frozenset(),
                 resolver: Callable[[str], list[str]] | None = None,
                 dialer: Dialer | None = None, upstream_ca: str | None = None,
                 approval: Approval | None = None) -> None:
        self.stages: list[tuple[str, float]] = [("spawn", time.monotonic())]
        self._approval = approval
        self._intercepting = None
        if request.network.credentials or request.network.http:
            from stockade.launch import credentials  # only launches that read requests pay

            request, inspector, authority = credentials.prepare(request, os.environ)
            self._intercepting = (inspector, authority, upstream_ca)
        try:
            self._start(request, stdio, bpf, weaken, resolver, dialer)
        except BaseException:
            if self._intercepting is not None:
                self._intercepting[1].close()
            raise

    def _start(self, request: LaunchRequest, stdio: Stdio, bpf: bytes, weaken: frozenset[str],
               resolver: Callable[[str], list[str]] | None, dialer: Dialer | None) -> None:
        self._request = request
        self._bound = "lifeline" not in weaken  # (tests only: nothing ends it but its command)
        self._closing = threading.Lock()
        child_fds, parent_files, transient = _stdio_fds(stdio)
        request_r, self._lifeline = os.pipe()
        status_r, status_w = os.pipe()
        view = _view(request, bpf, weaken, zygote.SPAWNER)
        frame = encode_frame(request.encode(), bpf, weaken,
                             encode_launch(request, _umask(), view and view[0]))
        # The frame goes in before the launch when the pipe can hold it: pid 1 then finds it
        # waiting instead of waiting for our reply round trip.
        early = _fit_pipe(self._lifeline, len(frame))
        if early:
            os.write(self._lifeline, frame)
        control, control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._pidfd = zygote.SPAWNER.launch(
                child_fds, request_r, status_w, control_theirs.fileno(),
                shape=Shape.of(weaken), view=view, tier=request.isolation != "namespaces")
        except BaseException:
            control.close()
            for f in parent_files:
                if f is not None:
                    f.close()
            for fd in (self._lifeline, status_r):
                os.close(fd)
            raise
        finally:
            control_theirs.close()
            for fd in (*transient, request_r, status_w):
                os.close(fd)
        self.stdin, self.stdout, self.stderr = parent_files
        self._status = status_r
        os.set_blocking(status_r, False)
        self._status_lines = StatusLines()
        self._events: list[dict] | None = None  # pid 1's events, once its status pipe closed
        self._reading = threading.Lock()
        # refusals(): the events and ignored lines taken, and the memory refusals counted
        self._taken = self._ignored = self._refused = 0
        self.enforced: dict = {}
        self._killed_at: float | None = None
        if not early:
            try:
                os.write(self._lifeline, frame)
            except BrokenPipeError:
                pass  # the sandbox died already; wait() reports why
        self.violations: list[Violation] = []
        self.network_log: list[dict] = []
        self._proxy = _start_proxy(request, control, resolver, dialer, weaken,
                                   self._intercepting, self._approval) \
            if request.network.mode == "allowlist" else None
        self._way_out = _usernet().WayOut.open(request, control, weaken) \
            if request.network.mode == "any" and "network" not in weaken else None
        control.close()

    def wait(self, timeout: float | None = None) -> Exit | None:
        """The sandbox is over when pid 1 has exited, or sooner, when its status pipe has
        closed after the `exit` event: pid 1 sends it only once every other process of the
        sandbox is dead and reaped (init._drain), and the rest is the kernel tearing the
        namespaces down."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._drained():
            watched = [self._pidfd] if self._events is not None else [self._pidfd, self._status]
            ready = _ready(watched, _left(deadline, self._killed_at))
            if self._status in ready:
                self._read_status()
            if self._pidfd in ready:
                break
            if ready:
                continue
            if not self._force() and deadline is not None and time.monotonic() >= deadline:
                return None
        return self._settle()

    def status_reader(self) -> tuple[int, Callable[[], bool]]:
        """pid 1's status pipe, read while the streams are pumped: a full one would make
        pid 1 lose its events (it does not wait: namewatch.c)."""
        def read() -> bool:
            self._read_status()
            return self._events is None

        return self._status, read

    def _read_status(self) -> bool:
        """One read of pid 1's status pipe; whether it held anything. (Under a lock: a warm
        sandbox's command reads it while close() may settle the sandbox on another thread.)"""
        with self._reading:
            if self._events is not None:
                return False
            try:
                chunk = os.read(self._status, 65536)
            except BlockingIOError:
                return False
            if chunk:
                self._status_lines.feed(chunk)
            else:  # (what follows the last newline is a line cut short: pid 1 was killed in it)
                self._events = self._status_lines.events
            return bool(chunk)

    def refusals(self) -> list[Violation]:
        """What pid 1 refused since the last call: its events that came meanwhile (each
        written before the refused call returned, so a command's are all there once it has
        ended). A limits.memory violation counts the refusals since the last call, said as
        one-shot runs say theirs (memory_refusal)."""
        while self._read_status():
            pass
        events = self._status_lines.events
        new, self._taken = events[self._taken:], len(events)
        violations = _refused(new, self._request.git)
        memory = [e for e in new if e["event"] == "memory_refused"]
        limit = self._request.limits.memory
        if memory and limit is not None:
            largest = max(memory, key=lambda e: e["size"])
            violations.append(Violation("limits.memory", memory_refusal(
                memory[-1]["refused"] - self._refused, largest["size"], largest["in_use"],
                limit)))
            self._refused = memory[-1]["refused"]
        ignored = self._status_lines.ignored_violation(self._ignored)
        self._ignored = self._status_lines.ignored
        return violations + ([ignored] if ignored else [])

    def _drained(self) -> bool:
        return self._events is not None and any(e["event"] == "exit" for e in self._events)

    @property
    def pid(self) -> int:
        """The sandbox's pid 1, as this process sees it (from its pidfd)."""
        with open(f"/proc/self/fdinfo/{self._pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
        raise ProcessLookupError("the sandbox's pidfd names no process")

    def kill(self) -> None:
        """Close the lifeline: the sandbox's init exits and the kernel kills the rest. Called
        again once pid 1 has had KILL_GRACE to do so: SIGKILL (see _force)."""
        with self._closing:
            if self._killed_at is None and self._lifeline >= 0 and self._bound:
                self._killed_at = time.monotonic()
        self._force()
        self._close_lifeline()

    def _force(self) -> bool:
        """SIGKILL pid 1 through its pidfd, which ends its pid namespace, if it has not exited
        KILL_GRACE after kill(): it acts on no lifeline while stuck in its setup, blocked or
        stopped. Whether it was sent."""
        with self._closing:  # (not after _settle closed the pidfd: its number may be reused)
            due = self._killed_at is not None and self._pidfd >= 0 \
                and time.monotonic() - self._killed_at > KILL_GRACE
            if due:
                _signal_pidfd(self._pidfd, signal.SIGKILL)
                self._killed_at = None
        return due

    def network_records(self) -> list[dict]:
        if self._way_out is not None:
            return self._way_out.denials()
        return self._proxy.denials() if self._proxy is not None else []

    def _close_lifeline(self) -> None:
        # kill() may come from another thread while this one settles: close the descriptor
        # once, or the second close could hit an unrelated descriptor that took its number.
        with self._closing:
            fd, self._lifeline = self._lifeline, -1
        if fd >= 0:
            os.close(fd)

    def _settle(self) -> Exit:
        killed = self._killed_at is not None or self._lifeline < 0
        self._close_lifeline()
        os.set_blocking(self._status, True)  # pid 1 is gone or has closed its end
        while self._events is None:
            self._read_status()
        with self._closing:
            pidfd, self._pidfd = self._pidfd, -1
        for fd in (self._status, pidfd):  # (read no more: _events is set)
            os.close(fd)
        events = self._events
        if self._proxy is not None:
            self._proxy.stop()
            self.network_log = self._proxy.denials()
            self.violations += network_denials(self.network_log)
        if self._intercepting is not None:
            self._intercepting[1].close()
        if self._way_out is not None:
            self._way_out.close()
            self.network_log = self._way_out.denials()
            self.violations += network_denials(self.network_log)
            if self._way_out.dropped:
                from stockade.linux.guard import LOG_RATE

                self.violations.append(Violation(
                    "network.denied_unrecorded", f"{self._way_out.dropped} more refusals of "
                    "the destination guard have no record: its log keeps at most "
                    f"{LOG_RATE}"))
        self.stages += [(e["name"], e["t"]) for e in events if e["event"] == "stage"]
        self.stages.append(("settle", time.monotonic()))
        self.violations += _refused(events, self._request.git)
        ignored = self._status_lines.ignored_violation()
        if ignored is not None:
            self.violations.append(ignored)
        for event in events:
            if event["event"] == "started":
                self.enforced = event["enforced"]
            elif event["event"] == "exit":
                self._watched_memory(event.get("memory"), self._request.limits.memory)
                if event.get("protected_unrecorded"):
                    self.violations.append(unrecorded_refusals(event["protected_unrecorded"]))
                return Exit(event["exit_code"], event["signal"])
            elif event["event"] == "error":
                return Exit(None, None, _with_hint(_error(event, self._request), self._request))
        if killed:
            return Exit(None, signal.SIGKILL)
        return Exit(None, None, SetupError(
            "launcher_failed", "the sandbox launcher ended unexpectedly", stage="launcher"))


    def _watched_memory(self, watch: dict | None, limit: int | None) -> None:
        """A `limits.memory` violation when pid 1 refused address-space requests at the limit
        (memwatch.c), and whether it watched them at all (in `enforced`)."""
        if watch is None or limit is None:
            return
        self.enforced["memory_watched"] = watch["watched"]
        if watch["refused"]:
            self.violations.append(Violation("limits.memory", memory_refusal(
                watch["refused"], watch["largest"], watch["in_use"], limit)))


def _refused(events: list[dict], git: str) -> list[Violation]:
    """What pid 1's records of names it did not make, and of writes refused in a `.git`, say."""
    return [protected_refusal(e) for e in events if e["event"] == "protected_name"] \
        + git_refusals([e for e in events if e["event"] == "git_guarded"], git)


def protected_refusal(event: dict) -> Violation:
    """What pid 1's refusal to make a protected name says (namewatch.c)."""
    if event.get("more"):
        return Violation("filesystem.protected", "more protected names were refused than are "
                         "recorded")
    where = event["directory"].rstrip("/") or ""
    if "/" in event["protected"]:  # (code the host runs: request.unmade)
        return Violation("filesystem.host_code", f"{where}/{event['name']}: not made "
                         f"({event['call']}): the host would run it outside the sandbox (the "
                         f"home's configuration, or what an import takes before a module the "
                         f"host imports), and it is not made from a sandbox whose write roots "
                         f"hold it")
    return Violation("filesystem.protected", f"{where}/{event['name']}: not made "
                     f"({event['call']}): {event['protected']} is a protected name in write "
                     f"roots; \"!{event['protected']}\" in filesystem.protected releases it")


def git_refusals(events: list[dict], mode: str) -> list[Violation]:
    """What pid 1's records of writes refused in a `.git` say (namewatch.c), once per path:
    git itself says only "Device or resource busy" or "Read-only file system". The way out is
    named, never the command's own words: a hostile command would have the host run them."""
    paths = list(dict.fromkeys(f"{e['directory'].rstrip('/')}/{e['name']}"
                               for e in events if not e.get("more")))
    if not paths:
        return [Violation("filesystem.git", "more writes in .git were refused than are "
                          "recorded")] if events else []
    repositories = dict.fromkeys(path.partition("/.git")[0] or "/" for path in paths)
    why = ("every .git is read-only in the sandbox" if mode == "read-only" else
           "a repository's config, hooks and gitdir pointers, what makes git run code, are "
           "read-only in the sandbox")
    host = " or ".join(f"git -C {shlex.quote(top)} config ..." for top in repositories)
    return [Violation("filesystem.git", f"{', '.join(paths)}: not written: filesystem.git is "
                      f'"{mode}": {why}; make that change with git on the host ({host}, '
                      "remote add, submodule init, ...), or set filesystem.git = \"writable\" "
                      "in the policy")]


def unrecorded_refusals(count: int) -> Violation:
    """Refusals of protected names whose event pid 1 could not write: it does not wait for
    a full status pipe (namewatch.c)."""
    return Violation("filesystem.protected", f"{count} more refusals of protected names "
                     "have no record: the status pipe was full when they came")


def memory_refusal(refused: int, largest: int, in_use: int, limit: int) -> str:
    """What a limits.memory violation says: the refusals and the largest, in MiB."""
    def mib(size: int) -> str:
        return f"{size / (1 << 20):.1f} MiB"
    what = "1 allocation" if refused == 1 else f"{refused} allocations"
    return (f"{what} refused at the {mib(limit)} address-space limit; the largest asked "
            f"{mib(largest)} with {mib(in_use)} in use")


KILL_GRACE = 1.0  # seconds a killed sandbox's pid 1 may take to exit before it gets SIGKILL


def _start_proxy(request: LaunchRequest, control: socket.socket,
                 resolver: Callable[[str], list[str]] | None, dialer: Dialer | None,
                 weaken: frozenset[str], intercepting: tuple[Inspector, Authority,
                                                             str | None] | None,
                 approval: Approval | None = None) -> Proxy | None:
    """The allowlist proxy, serving on the listener the sandbox's pid 1 passes out. None when
    pid 1 failed first (its error event says why). With `intercepting` (the inspector, the
    launch's CA, a CA file for upstreams or None), it reads requests (inspect.py)."""
    from stockade.net.proxy import Proxy  # only allowlist launches pay for it

    _, fds = recv_fds(control, 1)
    if len(fds) != 1:
        return None
    unchecked = frozenset(name.removeprefix("proxy_") for name in weaken
                          if name.startswith("proxy_"))
    reading = {}
    if intercepting is not None:
        from stockade.net.authority import upstream_context

        inspector, authority, upstream_ca = intercepting
        reading = {"inspector": inspector, "authority": authority,
                   "upstream_tls": upstream_context(upstream_ca)}
    proxy = Proxy(request.network.allow, request.network.deny, request.request_id,
                  resolver=resolver, dialer=dialer, unchecked=unchecked, approval=approval,
                  **reading)
    proxy.start(listener=socket.socket(fileno=fds[0]))
    return proxy


def _without_stockade_state(request: LaunchRequest) -> LaunchRequest:
    from dataclasses import replace

    places = set(request.stockade_state)
    return replace(request, deny=tuple(g for g in request.deny if g.path not in places))


def _view(request: LaunchRequest, bpf: bytes, weaken: frozenset[str],
          spawner: zygote.Zygote | zygote.ForkSpawner) -> tuple[bytes, bytes] | None:
    """The launch's view frame and, when a spare may be prepared for it, the identity of the
    host's state it would be built from now (a prepared spare is used only if both match)."""
    if not spawner.prepares or request.isolation != "namespaces" or "mount_view" in weaken \
            or request.network.mode == "any" or request.workspace == "overlay":
        # (a view template makes its view; the landlock tier has none; the way out of
        # network "any" is made with its launch, see net.open_out; an overlay's upper layer
        # is one launch's own, never to be mounted ahead by a spare)
        return None
    view = view_frame(request, bpf, weaken)
    return view, mnt.identity_now(request, weaken) if spawner.may_fit(view) else b""


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for a moment, for every
    thread)."""
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    raise SetupError("setup_failed", "the kernel does not report this process's umask",
                     stage="launcher")


def _fit_pipe(fd: int, size: int) -> bool:
    """Grow the pipe at `fd` to hold `size` bytes; False if the system does not allow it."""
    try:
        return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size) >= size
    except OSError:
        return False


def _left(deadline: float | None, killed_at: float | None) -> float | None:
    """How long the next poll may block."""
    now = time.monotonic()
    limits = [t for t in (deadline, None if killed_at is None else killed_at + KILL_GRACE)
              if t is not None]
    return max(min(limits) - now, 0) if limits else None


def _ready(fds: list[int], timeout: float | None) -> set[int]:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(None if timeout is None else int(timeout * 1000) + 1)}


def _signal_pidfd(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


def _stdio_fds(stdio: Stdio) -> tuple[tuple[int, int, int], list, list[int]]:
    """(fds for the child's 0/1/2, the parent's file objects for pipes, fds to close after the
    zygote has its copies), following subprocess's conventions (None, PIPE, DEVNULL, fd, file,
    and STDOUT for stderr: the same descriptor as stdout's)."""
    child: list[int] = []
    parent: list = [None, None, None]
    transient: list[int] = []
    for index, spec in enumerate((stdio.stdin, stdio.stdout, stdio.stderr)):
        if spec is None:
            child.append(index)
        elif spec == subprocess.STDOUT and index == 2:
            child.append(child[1])
        elif spec == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            child.append(fd)
            transient.append(fd)
        elif spec == subprocess.PIPE:
            read, write = os.pipe()
            ours, theirs = (write, read) if index == 0 else (read, write)
            parent[index] = open(ours, "wb" if index == 0 else "rb")  # noqa: SIM115
            child.append(theirs)
            transient.append(theirs)
        else:
            child.append(spec if isinstance(spec, int) else spec.fileno())
    return (child[0], child[1], child[2]), parent, transient


def _with_hint(error: Exception, request: LaunchRequest) -> Exception:
    """A command that could not be executed because it lies where nothing written may run
    says which knob would let it."""
    if not (isinstance(error, StartError) and error.code == "command_not_executable"
            and not request.exec_from_write and _written_place(request)):
        return error
    return StartError(error.code, f"{error.message}: it lies where the command may write, and "
                      "filesystem.exec_from_write is false (set it to true, or use the preset "
                      "workspace-write, which runs what the job builds)")


def _written_place(request: LaunchRequest) -> bool:
    """Whether the command (argv[0], found as the sandbox's PATH would find it) lies in a
    write root, the sandbox's /tmp or /dev/shm."""
    from stockade.linux.notfound import candidates  # (only a failed start pays for it)

    def under(path: str, places: list[str]) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in places)

    own = ["/tmp", "/dev/shm"]  # the sandbox's own: not to be looked up on the host
    for candidate in candidates(request):
        if under(candidate, own) or os.path.exists(candidate):
            return under(candidate, [g.path for g in request.write] + own)
    return False


def _error(event: dict, request: LaunchRequest) -> Exception:
    if event["kind"] == "start" and event["code"] == "command_not_found":
        from stockade.linux import notfound  # (only a failed start pays for looking)

        try:
            explained = notfound.explain(request)
        except Exception:  # noqa: BLE001 - an explanation that fails leaves the plain error
            explained = None
        return StartError(event["code"], explained or event["message"])
    if event["kind"] == "start":
        return StartError(event["code"], event["message"])
    if event["code"] in ("userns_unavailable", "landlock_unsupported", "seccomp_unavailable",
                         "supervisor_not_built"):
        return UnavailableError(event["code"], hint(event["message"]))
    if event.get("stage") in ("namespaces", "mount", "landlock", "seccomp", "privilege"):
        return SetupError(event["code"], hint(event["message"]), stage=event["stage"])
    if event["code"].startswith("unenforceable:"):
        return UnenforceableError(event["code"].split(":", 1)[1], event["message"])
    return SetupError(event["code"], event["message"], stage=event.get("stage", ""))
