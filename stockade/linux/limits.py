"""Resource limits without a delegated cgroup: rlimits, and pid_max of the sandbox's own pid
namespace as a process-count backstop that also holds for root (RLIMIT_NPROC does not bind a
process whose real uid is host root). Also the pid namespace's other knob, vm.memfd_noexec, and
whether the kernel seals memfds non-executable on request (its rootless stand-in).
"""

from __future__ import annotations

import functools
import os
import resource
from dataclasses import dataclass

from stockade.launch.request import LaunchRequest, LimitSpec
from stockade.linux import seccomp

PID_MAX_FLOOR = 301      # the kernel's smallest pid_max
RESERVED_PIDS = 300      # after wrapping, pids are handed out from here again
PID_MAX = "/proc/sys/kernel/pid_max"
MEMFD_NOEXEC = "/proc/sys/vm/memfd_noexec"
INIT_TASKS = 1          # the sandbox's pid 1 (supervisor.c), counted beside the command's


def cap_pid_namespace(limits: LimitSpec) -> int | None:
    """Bound how many pids the namespace can ever hold at once (a VM guest's agent; a
    sandbox's init sets every PidKnobs)."""
    value = pid_max_for(limits)
    if value is None:
        return None
    fd = os.open(PID_MAX, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)
    return value


@dataclass(frozen=True)
class PidKnobs:
    """What a sandbox sets in its own pid namespace: pid_max (None: left as it is), and
    whether vm.memfd_noexec = 2, so that no memfd can be executed (a memfd is written memory
    on a mount that is not noexec). Both are the pid namespace's own, and a child namespace
    cannot lower memfd_noexec; but the kernel lets only host root write it (its file is not
    the pid namespace's owner's, as pid_max's is), so a rootless sandbox cannot have it."""

    pid_max: int | None
    memfd_noexec: bool


def pid_knobs(request: LaunchRequest, weaken: frozenset[str]) -> PidKnobs:
    """The knobs for `request`; read while the host's /proc is still this process's. Without
    a pid namespace of its own (tests only), none: they would be the host's."""
    if "pid_namespace" in weaken:
        return PidKnobs(None, False)
    return PidKnobs(None if "pid_max" in weaken else pid_max_for(request.limits),
                    not request.exec_from_write and "memfd_noexec" not in weaken
                    and may_set_memfd_noexec())


def set_pid_knobs(knobs: PidKnobs) -> None:
    """In the sandbox's init (a spare cloned from a view template writes the same, in
    template.c)."""
    for path, value in ((PID_MAX, knobs.pid_max),
                        (MEMFD_NOEXEC, 2 if knobs.memfd_noexec else None)):
        if value is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(value).encode())
            finally:
                os.close(fd)


def may_set_memfd_noexec() -> bool:
    """Whether this process may write vm.memfd_noexec: only if its real uid is host root
    (the sysctl checks the uid, whatever namespace the process is in)."""
    return os.access(MEMFD_NOEXEC, os.W_OK)


MEMFD_WATCH = ("pid 1 makes the command's memfds sealed non-executable and refuses executions "
               "of memfds, deleted and written files (seccomp user notification)")
MFD_NOEXEC_SEAL = 0x0008  # memfd_create's flag (Linux 6.3): no one can make it executable


@functools.cache
def memfd_noexec_seal() -> bool:
    """Whether the kernel makes memfds sealed non-executable on request (MFD_NOEXEC_SEAL):
    what the sandbox's pid 1 does for every memfd of the command (memwatch.c) where
    vm.memfd_noexec is not the sandbox's to set."""
    try:
        os.close(os.memfd_create("stockade-probe", os.MFD_CLOEXEC | MFD_NOEXEC_SEAL))
    except OSError:
        return False
    return True


def pid_max_for(limits: LimitSpec) -> int | None:
    """The sandbox pid namespace's pid_max for `limits` (None: left as it is)."""
    return None if limits.pids is None else max(PID_MAX_FLOOR, RESERVED_PIDS + limits.pids)


def rlimit_values(limits: LimitSpec, beside: int = INIT_TASKS) -> tuple[int, int, int]:
    """RLIMIT_AS, RLIMIT_NPROC and RLIMIT_FSIZE for the command (-1: none; RLIMIT_CORE is
    always 0). RLIMIT_NPROC is counted per user namespace, in tasks: the command's `pids`
    and `beside`, the sandbox's own that outlive none of them."""
    def value(limit: int | None, more: int = 0) -> int:
        return -1 if limit is None else limit + more
    return value(limits.memory), value(limits.pids, beside), value(limits.file_size)


def apply_rlimits(limits: LimitSpec, beside: int = INIT_TASKS) -> None:
    """On this process, before it starts the commands (the VM guest's agent; in a Linux
    sandbox, supervisor.c applies rlimit_values to the command)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for kind, value in zip((resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE),
                           rlimit_values(limits, beside), strict=True):
        if value >= 0:
            resource.setrlimit(kind, (value, value))


def memory_watched(limits: LimitSpec, weaken: frozenset[str] = frozenset()) -> bool:
    """Whether the command's address-space requests refused at `limits.memory` are reported
    (stockade/linux/memwatch.c): with a memory limit, where seccomp user notification is.
    The "rlimits" weakening (tests only) takes the limit away, "seccomp" every filter."""
    return (limits.memory is not None and not weaken & {"rlimits", "seccomp"}
            and seccomp.user_notification_available())


def describe(limits: LimitSpec, weaken: frozenset[str] = frozenset()) -> dict[str, str]:
    """How each requested limit is enforced on this host (for the result and the report)."""
    root = os.getuid() == 0
    out: dict[str, str] = {}
    if limits.memory is not None:
        out["memory"] = "RLIMIT_AS (address space, per process)" + (
            "; mmap/mremap requests refused at the limit reported"
            if memory_watched(limits, weaken) else "")
    if limits.pids is not None:
        out["pids"] = ("pid_max of the sandbox pid namespace (at most pids + 300)" if root
                       else "RLIMIT_NPROC in the sandbox user namespace, exact")
    if limits.file_size is not None:
        out["file_size"] = "RLIMIT_FSIZE"
    if limits.timeout is not None:
        out["timeout"] = "wall clock, whole tree killed"
    if limits.output is not None:
        out["output"] = "captured bytes per stream, rest discarded and flagged"
    return out
