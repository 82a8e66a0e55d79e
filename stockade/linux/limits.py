"""Resource limits without a delegated cgroup: rlimits, and pid_max of the sandbox's own pid
namespace as a process-count backstop that also holds for root (RLIMIT_NPROC does not bind a
process whose real uid is host root). Also the pid namespace's other knob, vm.memfd_noexec.
"""

from __future__ import annotations

import os
import resource

from stockade.launch.request import LaunchRequest, LimitSpec

PID_MAX_FLOOR = 301      # the kernel's smallest pid_max
RESERVED_PIDS = 300      # after wrapping, pids are handed out from here again
INIT_TASKS = 1          # the sandbox's pid 1 (supervisor.c), counted beside the command's


def cap_pid_namespace(limits: LimitSpec) -> int | None:
    """In the sandbox's init: bound how many pids the namespace can ever hold at once (a spare
    cloned from a view template writes the same value, in template.c)."""
    value = pid_max_for(limits)
    if value is None:
        return None
    fd = os.open("/proc/sys/kernel/pid_max", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)
    return value


def memfd_noexec(request: LaunchRequest, weaken: frozenset[str]) -> bool:
    """Whether no memfd may be executed in the sandbox's pid namespace: where nothing the
    command writes may be executed (a memfd is written memory on a mount that is not noexec).
    vm.memfd_noexec is the pid namespace's own, and a child namespace cannot lower it."""
    return not request.exec_from_write and "memfd_noexec" not in weaken


def forbid_memfd_exec(request: LaunchRequest, weaken: frozenset[str]) -> bool:
    """In the sandbox's init: vm.memfd_noexec = 2 if `memfd_noexec` (a spare cloned from a
    view template writes it in template.c). Whether it was written."""
    if not memfd_noexec(request, weaken):
        return False
    fd = os.open("/proc/sys/vm/memfd_noexec", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b"2")
    finally:
        os.close(fd)
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


def describe(limits: LimitSpec) -> dict[str, str]:
    """How each requested limit is enforced on this host (for the result and the report)."""
    root = os.getuid() == 0
    out: dict[str, str] = {}
    if limits.memory is not None:
        out["memory"] = "RLIMIT_AS (address space, per process)"
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
