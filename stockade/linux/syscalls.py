"""Raw Linux system calls through ctypes: the libc handle, `syscall`, `prctl` and their numbers.

Only x86_64 and aarch64 are supported. Numbers from 403 up are shared by every architecture
(the unified table of asm-generic), so they live in one common map.
"""

from __future__ import annotations

import ctypes
import os

from stockade.errors import UnavailableError

libc = ctypes.CDLL(None, use_errno=True)

_libc_syscall = libc.syscall
_libc_syscall.restype = ctypes.c_long
_libc_prctl = libc.prctl
_libc_prctl.restype = ctypes.c_int
_libc_prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

_PER_ARCH: dict[str, dict[str, int]] = {
    "x86_64": {"bpf": 321, "capget": 125, "capset": 126, "clone": 56, "keyctl": 250,
               "seccomp": 317},
    "aarch64": {"bpf": 280, "capget": 90, "capset": 91, "clone": 220, "keyctl": 219,
                "seccomp": 277},
}

_COMMON: dict[str, int] = {
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "pidfd_open": 434, "clone3": 435, "close_range": 436, "openat2": 437,
    "mount_setattr": 442, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
    "landlock_restrict_self": 446, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466,
    "open_tree_attr": 467,
}


def arch() -> str:
    """The machine name, or UnavailableError if Stockade has no syscall table for it."""
    machine = os.uname().machine
    if machine not in _PER_ARCH:
        raise UnavailableError("arch_unsupported",
                               f"no syscall table for architecture {machine or 'unknown'}")
    return machine


def number(name: str) -> int:
    """The system call number of `name` on this architecture (KeyError if not in the table)."""
    if name in _COMMON:
        return _COMMON[name]
    return _PER_ARCH[arch()][name]


def _check(result: int) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def syscall(nr: int, *args: object) -> int:
    """Call system call `nr`; ints are passed as C longs. Raises OSError with errno on failure."""
    c_args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _check(_libc_syscall(ctypes.c_long(nr), *c_args))


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    """prctl(2). Raises OSError with errno on failure."""
    return _check(_libc_prctl(option, arg2, arg3, arg4, arg5))
