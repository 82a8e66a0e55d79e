"""Namespaces: start a sandbox's pid 1 in fresh user, mount, pid, ipc, uts, net and cgroup
namespaces.

The caller's uid and gid are mapped to themselves (one id each), and `setgroups` is denied, so
the sandbox holds no id it did not already have. For root that means uid 0 stays uid 0 for file
ownership, but every capability is dropped before the command runs (see privilege.py) and the
mounts the sandbox sees are locked to this user namespace.
"""

from __future__ import annotations

import ctypes
import os
import signal

from stockade.errors import UnavailableError
from stockade.linux.syscalls import number

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
CLONE_PIDFD = 0x00001000

_clone = ctypes.PyDLL(None, use_errno=True).syscall
_clone.restype = ctypes.c_long


def clone_sandbox(*, network: bool = True, pid_namespace: bool = True,
                  namespaces: int = SANDBOX_NAMESPACES) -> tuple[int, int]:
    """Fork a child that starts in fresh namespaces (`namespaces`: all of a sandbox's by
    default, the child then pid 1 of its pid namespace; a test that weakens the network or the
    pid namespace leaves it out), as os.fork would (CPython's fork hooks run around it), in
    one clone(2). Returns (0, -1) in the child, which is then root in
    its user namespace until its ids are mapped (`map_ids`, with the parent's uid and gid);
    and (its pid, a pidfd of it) in the parent. Only from a single-threaded process.

    One clone instead of fork, unshare and fork again: the process in between (a whole copy of
    the caller's address space, made and torn down at every launch) is gone."""
    left_out = (0 if network else CLONE_NEWNET) | (0 if pid_namespace else CLONE_NEWPID)
    flags = namespaces & ~left_out | CLONE_PIDFD | signal.SIGCHLD
    pidfd = ctypes.c_int(-1)
    ctypes.pythonapi.PyOS_BeforeFork()
    # Through a PyDLL function: the GIL stays held across the clone, as os.fork holds it.
    pid = _clone(ctypes.c_long(number("clone")), ctypes.c_long(flags), ctypes.c_long(0),
                 ctypes.byref(pidfd), ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0, -1
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise UnavailableError("userns_unavailable", _why_no_userns(err))
    return pid, pidfd.value


def map_ids(uid: int, gid: int) -> None:
    """In a fresh user namespace: map `uid` and `gid` to themselves, one id each, and deny
    setgroups. (A view template maps its spares' the same way, in template.c.)"""
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
