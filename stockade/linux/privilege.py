"""Privileges of the command: lock securebits, drop every capability, close stray descriptors.

All of it is per thread: pid 1 (init.py, a single thread) applies it to itself, and the
supervisor it becomes and the command that forks inherit it. `prepare` runs while it still
holds its capabilities; `drop_all` runs after Landlock and before seccomp. `capabilities_now`
reads them back for tests and the readiness probe.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass

from stockade.linux.syscalls import number, prctl, syscall

_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_RAISE = 2
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_SETPCAP = 8
_CAPABILITY_VERSION_3 = 0x20080522
_UINT_MAX = 0xFFFFFFFF

# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE set, KEEP_CAPS clear, all four locked: uid 0
# gains nothing from exec or setuid, and no later call can change that.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

_STATUS_HEX = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
_STATUS_DEC = ("NoNewPrivs", "Seccomp")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


@dataclass(frozen=True)
class Securebits:
    """Whether `prepare` locked the securebits, and why not if it could not."""

    locked: bool
    reason: str


def prepare() -> Securebits:
    """Lock SECUREBITS. Without CAP_SETPCAP that is impossible and reported, not raised."""
    try:
        prctl(_PR_SET_SECUREBITS, SECUREBITS)
    except PermissionError:
        if _effective_has(_CAP_SETPCAP):
            raise
        return Securebits(False, "no CAP_SETPCAP in this user namespace")
    return Securebits(True, "")


def drop_all() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable sets; set no_new_privs.

    The bounding set can only shrink with CAP_SETPCAP: a user outside any user namespace (the
    landlock tier, rootless) keeps it, and no_new_privs is what stops an exec from gaining any
    capability there (the readiness probe judges it so)."""
    for cap in itertools.count():
        try:
            if not prctl(_PR_CAPBSET_READ, cap):
                continue
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # past the kernel's last capability
                break
            raise
        try:
            prctl(_PR_CAPBSET_DROP, cap)
        except PermissionError:
            if _effective_has(_CAP_SETPCAP):
                raise
            break
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    syscall(number("capset"), ctypes.byref(header), ctypes.byref((_CapData * 2)()))
    prctl(_PR_SET_NO_NEW_PRIVS, 1)


def close_fds(keep: Iterable[int]) -> None:
    """Close every descriptor from 3 up that is not in `keep`."""
    first = 3
    for fd in sorted(set(keep)):
        if fd >= first:
            if fd > first:
                _close_range(first, fd - 1)
            first = fd + 1
    _close_range(first, _UINT_MAX)


def keep_across_exec(cap: int) -> None:
    """Keep capability `cap` (held now) across the next exec, as an ambient capability: a
    program pid 1 runs (nft, guard.py) is not uid 0 in a rootless sandbox's user namespace,
    and would lose it. For a child about to exec, never for the command."""
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    syscall(number("capget"), ctypes.byref(header), ctypes.byref(data))
    data[cap // 32].inheritable |= 1 << (cap % 32)
    syscall(number("capset"), ctypes.byref(header), ctypes.byref(data))
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_RAISE, cap)


def capabilities_now() -> dict[str, int]:
    """Cap{Inh,Prm,Eff,Bnd,Amb} (as bit masks), NoNewPrivs and Seccomp of this process."""
    values: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in _STATUS_HEX:
                values[key] = int(value, 16)
            elif key in _STATUS_DEC:
                values[key] = int(value)
    return values


def _effective_has(cap: int) -> bool:
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    syscall(number("capget"), ctypes.byref(header), ctypes.byref(data))
    return bool(data[cap // 32].effective & (1 << (cap % 32)))


def _close_range(first: int, last: int) -> None:
    try:
        syscall(number("close_range"), first, last, 0)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:  # close_range arrived in Linux 5.9
            raise
        os.closerange(first, min(last, os.sysconf("SC_OPEN_MAX") - 1) + 1)
