"""pid 1's second half: supervisor.c, the static program the sandbox's pid 1 becomes before
its command starts.

pid 1 is first a Python process cloned from the zygote (init.py): it builds its view and
confines itself. Then it execs the supervisor, which starts the command, reaps, reports and
drains (see supervisor.c). An idle sandbox is so kept by well under 1 MiB instead of a Python
interpreter's ≈ 15 MiB, and a launch pays for no Python thread, spawn or poll loop. A view
template (template.py) execs the same program once its view is built (`become_template`); the
spares it clones are the program from their first instruction: they make their own
filesystems and confine themselves in C (template.c, refresh.c, confine.c) from what the
template computed in Python, and go on as the supervisor.

The program is copied once per process (the zygote, or the CLI) into a sealed memfd before
any sandbox exists, and pid 1 execs that copy: neither what a command writes to the installed
file while that process lives, nor anything in the sandbox's view (it is linked statically),
can change what pid 1 runs. It is built at install time (setup.py); without it the Linux
backend refuses, typed (`supervisor_not_built`).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import struct
from collections.abc import Sequence
from typing import NoReturn

from stockade.launch.request import LimitSpec
from stockade.linux import limits

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor")
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_RLIMITS = 1  # plan flag: apply the rlimits
_WATCH_MEMORY = 2  # plan flag: show the command's address-space requests to pid 1 (memwatch.c)
_UNBOUND = 4  # plan flag (tests only): pid 1 ignores its owner's lifeline
_KEEP_FDS = 8  # plan flag (tests only): the command inherits pid 1's other descriptors
_WATCH_EXEC = 16  # plan flag: refuse executable mappings and executions of written files
_SEAL_MEMFD = 32  # plan flag: pid 1 makes the command's memfds sealed non-executable (memwatch.c)
_WATCH_NAMES = 64  # plan flag: pid 1 makes the command's new names, none protected (namewatch.c)
_PROC_UNGUARDED = 128  # plan flag (tests only): pid 1 looks inside any /proc/<pid> for them
# flags; RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE; the nested Landlock domain's handled rights and
# scopes; the size of the enforced record
_HEAD = struct.Struct("<IqqqQQI")
_NO_VIEW = bytes(32)
MISSING = ("the sandbox's supervisor (stockade/linux/supervisor) was not built: reinstall "
           "Stockade where a C compiler and a static C library are present (Debian: gcc "
           "libc6-dev)")


def built() -> bool:
    return os.access(PROGRAM, os.X_OK)


@functools.cache
def descriptor() -> int | None:
    """A sealed memfd holding the program (one per process, kept open), or None."""
    try:
        program = os.open(PROGRAM, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    fd = os.memfd_create("stockade-supervisor", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
    try:
        size, copied = os.fstat(program).st_size, 0
        while copied < size:  # (in the kernel: ≈ 0.3 ms, a third of read and write)
            sent = os.sendfile(fd, program, copied, size - copied)
            if not sent:
                raise OSError("the supervisor changed size while being copied")
            copied += sent
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        return None
    finally:
        os.close(program)
    return fd


def plan(spec: LimitSpec, rlimits: bool, watch_memory: bool, nested: tuple[int, int],
         enforced: dict, view_digest: bytes | None, launch: bytes, *, bound: bool = True,
         close_fds: bool = True, written: Sequence[str] | None = None,
         seal_memfd: bool = False, names: Sequence[str] | None = None,
         free: Sequence[str] = (), proc_guard: bool = True) -> int:
    """A memfd holding what the supervisor is told: the command's rlimits (if `rlimits`),
    whether its address-space requests are shown to pid 1 (`watch_memory`, memwatch.c), its
    nested Landlock domain (landlock.nested_domain; (0, 0): none), the `enforced` record of
    its "started" event, the digest of the view frame a spare was made for (None: not a
    spare) and the launch part of the frame (empty for a spare, which reads its own). Not
    `bound` or not `close_fds` (tests only): pid 1 ignores its owner's lifeline, or the
    command inherits pid 1's descriptors. With `written` (the paths the command may write, as
    it sees them), pid 1 refuses executable mappings and executions of files on their mounts,
    and of memfds and deleted files; with `seal_memfd` it makes every memfd of the command
    itself, sealed non-executable (memwatch.c). With `names` (lower case), pid 1 makes every
    name the command makes itself, and none of those but on the mounts of the `free` paths
    (namewatch.c). Not `proc_guard` (tests only): pid 1 makes those lookups inside another
    process's /proc/<pid> too, its own /proc/1 among them (memwatch.c's another_process)."""
    memory, processes, file_size = limits.rlimit_values(spec)
    flags = (_RLIMITS if rlimits else 0) | (_WATCH_MEMORY if watch_memory else 0) \
        | (0 if bound else _UNBOUND) | (0 if close_fds else _KEEP_FDS) \
        | (0 if written is None else _WATCH_EXEC) | (_SEAL_MEMFD if seal_memfd else 0) \
        | (0 if names is None else _WATCH_NAMES) | (0 if proc_guard else _PROC_UNGUARDED)
    paths, protected, where = (b"".join(os.fsencode(path) + b"\0" for path in part or ())
                               for part in (written, names, free if names is not None else ()))
    body = json.dumps(enforced).encode()
    data = b"".join((
        _HEAD.pack(flags, memory, processes, file_size, *nested, len(body)), body,
        view_digest or _NO_VIEW, struct.pack("<I", len(paths)), paths,
        struct.pack("<I", len(protected)), protected, struct.pack("<I", len(where)), where,
        struct.pack("<I", len(launch)), launch))
    return memfd("stockade-plan", data)


def memfd(name: str, data: bytes) -> int:
    """A memfd holding `data`, for the supervisor to read (it preads from offset 0)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])
    return fd


def become(program: int, plan_fd: int, listener: int | None, handoff: int | None = None,
           launch_fds: list[int] | None = None) -> NoReturn:
    """Exec the supervisor as this process (pid 1): as a spare that waits on `handoff`, or
    with the launch's descriptors. Raises OSError if the exec fails."""
    passed = [plan_fd, -1 if listener is None else listener]
    passed += [handoff] if launch_fds is None else [-2, *launch_fds]  # (-2: written "-")
    for fd in passed:
        if fd >= 0:
            os.set_inheritable(fd, True)
    argv = ["supervisor", *("-" if fd == -2 else str(fd) for fd in passed)]
    os.execve(program, argv, {})


def become_template(program: int, spec: int, plan_fd: int, handoff: int, host_proc: int
                    ) -> NoReturn:
    """Exec the supervisor as a view template whose view is built (template.c): it clones
    the spares of the view from `spec` (template.py) and gives each the same `plan_fd`."""
    passed = (spec, plan_fd, handoff, host_proc)
    for fd in passed:
        os.set_inheritable(fd, True)
    os.execve(program, ["supervisor", "template", *map(str, passed)], {})
