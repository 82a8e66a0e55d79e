"""Who is at the other end of a unix socket, as the kernel tells it: the peer's process read
through a pidfd and its own `/proc` directory, never what the peer says about itself.

Stockade's servers (the daemon, the CLI server) serve only a peer whose *context* is their own
(and their clients talk only to a server whose context is theirs: stockade/linux/servercheck.py):
the same user, the same namespaces and root, the same capabilities, `no_new_privs`, seccomp
state and LSM label (and, for the CLI server, whose runs take its place, the same groups,
resource limits, CPU affinity, nice value, scheduling policy and OOM score adjustment; for one
the command line started by itself, the same cgroup too). Every Stockade sandbox has
namespaces of its own, so no process inside one is ever served, whatever it can reach or send.

The peer is pinned by `SO_PEERPIDFD` (Linux 6.5): the pidfd names the process that connected,
and its `/proc` directory is opened and then checked to still belong to that live process, so
a pid recycled after the peer died cannot stand in for it. Where the kernel has no
`SO_PEERPIDFD`, the pid from `SO_PEERCRED` is pinned with `pidfd_open` and the process must
have started before the connection was accepted.
"""

from __future__ import annotations

# _socket and no ctypes: `stockade run`'s fast path checks its server through this module.
import _socket
import contextlib
import errno
import os
import signal
import struct
import time
from collections.abc import Iterable

SO_PEERPIDFD = 77
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
CONFINEMENT = ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
               "Seccomp", "Seccomp_filters")
# What a served run takes from its server rather than from its client: they must agree too
# (supplementary groups, resource limits, CPU affinity, nice value and scheduling policy, OOM
# score adjustment).
RUN_CONTEXT = ("Groups", "limits", "Cpus_allowed_list", "sched", "oom_score_adj")
# A server the command line started by itself (stockade/cli/autoserver.py) serves only the
# cgroup it was started in: its runs take its cgroup, which nobody chose for them.
STARTED_CONTEXT = (*RUN_CONTEXT, "cgroup")


class PeerRefused(Exception):
    """The peer is not served; `.why` names the first part of its context that differs (never
    a value)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def own_context(parts: Iterable[str] = ()) -> dict[str, str]:
    """This process's context (see `context_of`)."""
    proc = os.open("/proc/self", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return context_of(proc, parts)
    finally:
        os.close(proc)


def context_of(proc: int, parts: Iterable[str] = ()) -> dict[str, str]:
    """The context of the process whose `/proc` directory is open at `proc`: its namespaces,
    its root, the confinement of its credentials and its LSM label, plus `parts` of
    RUN_CONTEXT. OSError if any of it cannot be read (a peer we may not inspect is not served).
    """
    found = {}
    for name in NAMESPACES:
        with contextlib.suppress(FileNotFoundError):  # a kind this kernel does not have
            found[f"ns/{name}"] = os.readlink(f"ns/{name}", dir_fd=proc)
    root = os.stat("root", dir_fd=proc)
    found["root"] = f"{root.st_dev}:{root.st_ino}"
    wanted = set(CONFINEMENT) | set(parts)
    for line in _read("status", proc).splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            found[name] = value.strip()
    for part in ("limits", "cgroup", "oom_score_adj"):
        if part in wanted:
            found[part] = _read(part, proc)
    if "sched" in wanted:  # nice and policy: fields 19 and 41 of stat, 17 and 39 after comm
        fields = _read("stat", proc).rsplit(")", 1)[1].split()
        found["sched"] = f"{fields[16]} {fields[38]}"
    try:
        found["lsm"] = _read("attr/current", proc)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: no LSM keeps a label
            raise
        found["lsm"] = "-"
    return found


def check_peer(conn: _socket.socket, own: dict[str, str], *, accepted: float) -> None:
    """Return if the process at the other end of `conn` (a server's: the one that connected;
    a client's: the one that listens) has context `own` (built with the same `parts`); raise
    PeerRefused otherwise. `accepted` is CLOCK_BOOTTIME (seconds) when the connection was
    accepted or made (for kernels without SO_PEERPIDFD)."""
    _, uid = _peercred(conn)
    if uid != os.geteuid():
        raise PeerRefused("another user")
    parts = [part for part in STARTED_CONTEXT if part in own]
    try:
        pidfd, pinned_by_kernel = _peer_pidfd(conn)
    except OSError:
        raise PeerRefused("the peer's process cannot be identified") from None
    try:
        try:
            pid = _pid_of(pidfd)
            proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise PeerRefused("the peer's process is gone or in another pid namespace") \
                from None
        try:
            _still_alive(pidfd)  # so `proc` is that process's own directory
            if not pinned_by_kernel and _started(proc) > accepted:
                raise PeerRefused("the peer's pid names a process started after it connected")
            context = context_of(proc, parts)
        except OSError:
            raise PeerRefused("the peer's process cannot be inspected") from None
        finally:
            os.close(proc)
    finally:
        os.close(pidfd)
    for key in sorted(own.keys() | context.keys(), key=lambda k: (not k.startswith("ns/"), k)):
        if own.get(key) != context.get(key):
            raise PeerRefused(_named(key))  # (a namespace first: it says the most)


def boottime() -> float:
    """CLOCK_BOOTTIME in seconds (the clock of a process's start time in /proc)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _peer_pidfd(conn: _socket.socket) -> tuple[int, bool]:
    try:
        return struct.unpack("i", conn.getsockopt(_socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0], True
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL):
            raise
    return os.pidfd_open(_peercred(conn)[0]), False


def _peercred(conn: _socket.socket) -> tuple[int, int]:
    """The peer's pid and uid as SO_PEERCRED has them (as of its connect or listen)."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED,
                                                      12))
    return pid, uid


def _pid_of(pidfd: int) -> int:
    """The pid a pidfd names in this pid namespace (OSError if it has none or has exited)."""
    with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as info:
        for line in info:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
                break
    raise ProcessLookupError(errno.ESRCH, "the pidfd names no process here")


def _still_alive(pidfd: int) -> None:
    signal.pidfd_send_signal(pidfd, 0)


def _started(proc: int) -> float:
    """When the process started, in CLOCK_BOOTTIME seconds."""
    stat = _read("stat", proc)
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")


def _read(path: str, proc: int) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return data.decode("utf-8", "replace")
    finally:
        os.close(fd)


def _named(key: str) -> str:
    """What differs, in words (the values stay unsaid)."""
    if key.startswith("ns/"):
        return f"the peer runs in another {key[3:]} namespace (inside a sandbox or container)"
    return {
        "root": "the peer has another root directory",
        "lsm": "the peer has another LSM label",
        "limits": "the peer has other resource limits",
        "cgroup": "the peer runs in another cgroup",
        "Cpus_allowed_list": "the peer may run on other CPUs",
        "sched": "the peer has another nice value or scheduling policy",
        "oom_score_adj": "the peer has another OOM score adjustment",
        "Groups": "the peer has other supplementary groups",
        "NoNewPrivs": "the peer runs with no_new_privs",
        "Seccomp": "the peer runs under another seccomp filter",
        "Seccomp_filters": "the peer runs under another seccomp filter",
    }.get(key, "the peer has other credentials or capabilities")
