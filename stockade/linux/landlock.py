"""Landlock: confine this process (and everything it execs) to the policy's roots.

`apply` builds one ruleset with every right the running kernel's ABI can handle, grants the read,
write and device roots, sets no_new_privs and restricts the calling thread. Rights the kernel cannot
handle are simply not restricted by Landlock; `LandlockStatus` says what was.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass

from stockade.errors import UnavailableError
from stockade.linux.syscalls import number, prctl, syscall

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights: name -> (bit, first ABI that handles it).
_FS_RIGHTS: dict[str, tuple[int, int]] = {
    "execute": (1 << 0, 1),
    "write_file": (1 << 1, 1),
    "read_file": (1 << 2, 1),
    "read_dir": (1 << 3, 1),
    "remove_dir": (1 << 4, 1),
    "remove_file": (1 << 5, 1),
    "make_char": (1 << 6, 1),
    "make_dir": (1 << 7, 1),
    "make_reg": (1 << 8, 1),
    "make_sock": (1 << 9, 1),
    "make_fifo": (1 << 10, 1),
    "make_block": (1 << 11, 1),
    "make_sym": (1 << 12, 1),
    "refer": (1 << 13, 2),
    "truncate": (1 << 14, 3),
    "ioctl_dev": (1 << 15, 5),
}
_FS = {name: bit for name, (bit, _) in _FS_RIGHTS.items()}
# The only rights the kernel accepts on a rule for a non-directory.
_FILE_RIGHTS = (_FS["execute"] | _FS["write_file"] | _FS["read_file"] | _FS["truncate"]
                | _FS["ioctl_dev"])

_NET_ABI = 4
_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1

_SCOPE_ABI = 6
_SCOPES = {"abstract_unix_socket": 1 << 0, "signal": 1 << 1}

EXECUTE = _FS["execute"]
_READ = _FS["read_file"] | _FS["read_dir"] | _FS["execute"]
_DEVICE = _FS["read_file"] | _FS["write_file"] | _FS["ioctl_dev"] | _FS["read_dir"]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


@dataclass(frozen=True)
class LandlockRules:
    """Roots as the process sees them when `apply` runs. Every path must exist."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...]
    exec_from_write: bool
    deny_tcp: bool
    scope: bool
    tcp_connect_ports: tuple[int, ...] = ()   # the exceptions to deny_tcp (connect only)


@dataclass(frozen=True)
class LandlockStatus:
    """What the applied ruleset restricts."""

    abi: int
    handled_fs: tuple[str, ...]
    tcp_restricted: bool
    scopes: tuple[str, ...]


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is not built in or disabled."""
    try:
        return syscall(number("landlock_create_ruleset"), None, 0, _CREATE_RULESET_VERSION)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def describe() -> dict[str, object]:
    """The Landlock ABI of this kernel and which groups of rights it can enforce."""
    abi = abi_version()
    return {
        "abi": abi,
        "filesystem": abi >= 1,
        "refer": abi >= 2,
        "truncate": abi >= 3,
        "tcp_bind_connect": abi >= _NET_ABI,
        "ioctl_dev": abi >= 5,
        "scope_abstract_unix_socket": abi >= _SCOPE_ABI,
        "scope_signal": abi >= _SCOPE_ABI,
    }


@dataclass(frozen=True)
class Ruleset:
    """A ruleset for this kernel's ABI, as numbers: what `apply` makes (and a view template's
    spares make in C, see template.py)."""

    abi: int
    handled_fs: int
    handled_net: int
    scoped: int
    grants: tuple[tuple[str, int], ...]  # (path, rights beneath it)
    tcp_connect_ports: tuple[int, ...]


def ruleset(rules: LandlockRules) -> Ruleset:
    """The ruleset `rules` make on this kernel; UnavailableError without Landlock."""
    abi = abi_version()
    if abi == 0:
        raise UnavailableError("landlock_unsupported",
                               "this kernel has no Landlock, or it is disabled")
    handled = sum(bit for bit, first in _FS_RIGHTS.values() if first <= abi)
    tcp = rules.deny_tcp and abi >= _NET_ABI
    scoped = sum(_SCOPES.values()) if rules.scope and abi >= _SCOPE_ABI else 0
    return Ruleset(abi, handled, _NET_BIND_TCP | _NET_CONNECT_TCP if tcp else 0, scoped,
                   tuple(_grants(rules, handled)), rules.tcp_connect_ports if tcp else ())


def apply(rules: LandlockRules) -> LandlockStatus:
    """Restrict the calling thread to `rules`; sets no_new_privs. Irreversible."""
    return restrict(ruleset(rules))


def restrict(made: Ruleset) -> LandlockStatus:
    """Restrict the calling thread to the ruleset `made`; sets no_new_privs. Irreversible."""
    attr = _RulesetAttr(handled_access_fs=made.handled_fs, handled_access_net=made.handled_net,
                        scoped=made.scoped)
    fd = syscall(number("landlock_create_ruleset"), ctypes.byref(attr), ctypes.sizeof(attr), 0)
    try:
        for path, access in made.grants:
            _allow_beneath(fd, path, access)
        for port in made.tcp_connect_ports:
            net = _NetPortAttr(allowed_access=_NET_CONNECT_TCP, port=port)
            syscall(number("landlock_add_rule"), fd, _RULE_NET_PORT, ctypes.byref(net), 0)
        prctl(_PR_SET_NO_NEW_PRIVS, 1)
        syscall(number("landlock_restrict_self"), fd, 0)
    finally:
        os.close(fd)
    return LandlockStatus(
        abi=made.abi,
        handled_fs=tuple(name for name, bit in _FS.items() if made.handled_fs & bit),
        tcp_restricted=bool(made.handled_net),
        scopes=tuple(name for name, bit in _SCOPES.items() if made.scoped & bit),
    )


def nested_domain() -> tuple[int, int]:
    """(handled filesystem rights, scopes) of a domain for the command inside the one `apply`
    gave pid 1. It handles only making block devices, which `apply` denies everywhere, so it
    takes nothing more from the command; but a process cannot trace one outside its own
    domain's descendants, nor (scopes, ABI 6) signal it: pid 1 stays out of the command's
    reach."""
    scopes = sum(_SCOPES.values()) if abi_version() >= _SCOPE_ABI else 0
    return _FS["make_block"], scopes


def rights(handled: int, exec_from_write: bool) -> tuple[int, int, int]:
    """(read, write, device) rights beneath a root, of those `handled`."""
    write = handled & ~(_FS["make_char"] | _FS["make_block"])
    if not exec_from_write:
        write &= ~_FS["execute"]
    return _READ & handled, write, _DEVICE & handled


def _grants(rules: LandlockRules, handled: int) -> list[tuple[str, int]]:
    read, write, device = rights(handled, rules.exec_from_write)
    return ([(path, read) for path in rules.read]
            + [(path, write) for path in rules.write]
            + [(path, device) for path in rules.devices])


def _allow_beneath(ruleset: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode):
            raise OSError(errno.ELOOP, "a Landlock root must not be a symbolic link", path)
        if not stat.S_ISDIR(mode):
            access &= _FILE_RIGHTS
        attr = _PathBeneathAttr(allowed_access=access, parent_fd=fd)
        try:
            syscall(number("landlock_add_rule"), ruleset, _RULE_PATH_BENEATH, ctypes.byref(attr), 0)
        except OSError as exc:
            raise OSError(exc.errno, f"landlock_add_rule: {exc.strerror}", path) from None
    finally:
        os.close(fd)
