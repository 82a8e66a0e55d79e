"""Restricted hosts, built on this machine: run a program as it would run on a host where
unprivileged user namespaces cannot be made.

    python restricted_host.py container -- argv...   # a container runtime's seccomp filter
    python restricted_host.py no-userns -- argv...    # user.max_user_namespaces = 0
    python restricted_host.py no-mounts -- argv...    # namespaces, but every mount refused

`container` installs on itself a seccomp filter like Docker's and Podman's default profile
(no unshare, setns or mount API, no clone with a namespace flag, clone3 -> ENOSYS), which the
program it execs inherits. `no-userns` makes a user namespace of its own (the caller's ids
mapped to themselves), sets user.max_user_namespaces = 0 in it, and execs the program there,
where no further user namespace can be made. `no-mounts` lets namespaces be made but refuses
every mount in them, as an LSM that confines unprivileged user namespaces does (AppArmor's
kernel.apparmor_restrict_unprivileged_userns). None needs privilege.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from stockade.linux import ns, seccomp  # noqa: E402

# Docker's default profile without CAP_SYS_ADMIN, in what matters for namespaces and mounts.
CONTAINER_DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
                    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                    "mount_setattr")
_PR_SET_NO_NEW_PRIVS = 38


MOUNT_CALLS = CONTAINER_DENIED[2:]


def no_mounts_filter() -> bytes:
    return seccomp.compile_rules([(name, errno.EPERM, ()) for name in MOUNT_CALLS])


def container_filter() -> bytes:
    rules: list[seccomp.Rule] = [(name, errno.EPERM, ()) for name in CONTAINER_DENIED]
    rules.append(("clone3", errno.ENOSYS, ()))
    rules += [("clone", errno.EPERM, (seccomp.masked(0, 1 << bit, 1 << bit),))
              for bit in range(32) if ns.SANDBOX_NAMESPACES & (1 << bit)]
    return seccomp.compile_rules(rules)


def install(bpf: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    seccomp.install(bpf)


def enter_no_userns() -> None:
    uid, gid = os.getuid(), os.getgid()
    if ctypes.CDLL(None, use_errno=True).unshare(ns.CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    ns.map_ids(uid, gid)
    with open("/proc/sys/user/max_user_namespaces", "w") as knob:
        knob.write("0")


HOSTS = {"container": lambda: install(container_filter()), "no-userns": enter_no_userns,
         "no-mounts": lambda: install(no_mounts_filter())}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or argv[0] not in HOSTS:
        print(__doc__, file=sys.stderr)
        return 2
    HOSTS[argv[0]]()
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
