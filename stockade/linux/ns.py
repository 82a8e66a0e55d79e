"""Namespaces: enter fresh user, mount, pid, ipc, uts, net and cgroup namespaces.

The caller's uid and gid are mapped to themselves (one id each), and `setgroups` is denied, so
the sandbox holds no id it did not already have. For root that means uid 0 stays uid 0 for file
ownership, but every capability is dropped before the command runs (see privilege.py) and the
mounts the sandbox sees are locked to this user namespace.
"""

from __future__ import annotations

import ctypes
import os

from stockade.errors import UnavailableError
from stockade.linux.syscalls import libc

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

SANDBOX_NAMESPACES = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
                      | CLONE_NEWNET | CLONE_NEWCGROUP)
NAMESPACE_NAMES = ("user", "mnt", "pid", "ipc", "uts", "net", "cgroup")


def unshare_all(*, network: bool = True) -> None:
    """Move this (single-threaded) process into fresh namespaces and map its ids."""
    uid, gid = os.getuid(), os.getgid()
    flags = SANDBOX_NAMESPACES if network else SANDBOX_NAMESPACES & ~CLONE_NEWNET
    if libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise UnavailableError("userns_unavailable", _why_no_userns(err))
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _why_no_userns(err: int) -> str:
    text = f"cannot create user namespaces ({os.strerror(err)})"
    for knob, bad in (("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                      ("/proc/sys/user/max_user_namespaces", "0"),
                      ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        try:
            with open(knob) as f:
                if f.read().strip() == bad:
                    return f"{text}: disabled by {knob} = {bad}"
        except OSError:
            continue
    return text
