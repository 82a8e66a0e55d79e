"""Resource limits without a delegated cgroup: rlimits, and pid_max of the sandbox's own pid
namespace as a process-count backstop that also holds for root (RLIMIT_NPROC does not bind a
process whose real uid is host root).
"""

from __future__ import annotations

import os
import resource

from stockade.launch.request import LimitSpec

PID_MAX_FLOOR = 301      # the kernel's smallest pid_max
RESERVED_PIDS = 300      # after wrapping, pids are handed out from here again
INIT_THREADS = 2         # pid 1's main thread and its starter (init.py)
INIT_MEMORY_MARGIN = 64 << 20  # bytes pid 1 may still map under RLIMIT_AS (its JSON, its reaping)


def cap_pid_namespace(limits: LimitSpec) -> int | None:
    """In the sandbox's init: bound how many pids the namespace can ever hold at once."""
    if limits.pids is None:
        return None
    value = max(PID_MAX_FLOOR, RESERVED_PIDS + limits.pids)
    with open("/proc/sys/kernel/pid_max", "w") as f:
        f.write(str(value))
    return value


def init_can_live_under(limits: LimitSpec) -> bool:
    """Whether the sandbox's pid 1 can take the rlimits on itself and still start the command:
    its address space (a Python interpreter's) stays well below the memory limit."""
    if limits.memory is None:
        return True
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmSize:"):
                return int(line.split()[1]) * 1024 + INIT_MEMORY_MARGIN <= limits.memory
    return False


def apply_rlimits(limits: LimitSpec) -> None:
    """On the command (through pid 1, or in a child forked to exec it), before it starts."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory, limits.memory))
    if limits.pids is not None:
        # Counted per user namespace, in threads: the sandbox's own only, its init's two
        # (which live as long as the sandbox) besides the command's `pids`.
        bound = limits.pids + INIT_THREADS
        resource.setrlimit(resource.RLIMIT_NPROC, (bound, bound))
    if limits.file_size is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size, limits.file_size))


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
