"""seccomp: Stockade's system-call deny-list, compiled with libseccomp, installed without it.

`compile_filter` loads libseccomp with ctypes and returns a classic BPF program; it runs once in
the parent. `install` needs only the kernel, so a forked child can load those bytes just before
execve. The filter allows by default, answers the calls below with an errno, and kills the process
on any other architecture's calling convention (x32 and i386 calls on x86_64 included).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

from stockade.errors import UnavailableError
from stockade.linux import syscalls

DENIED_SYSCALLS: tuple[str, ...] = (
    # mounts and the new mount API
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    # namespaces
    "setns", "unshare",
    # reaching into other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
    # kernel keyrings
    "keyctl", "add_key", "request_key",
    # kernel attack surface
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "fanotify_init", "open_by_handle_at", "name_to_handle_at",
    # host administration
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "quotactl",
    "quotactl_fd", "swapon", "swapoff", "reboot", "acct", "syslog", "lookup_dcookie",
)

# clone(2) flags that create a namespace (its first argument on x86_64 and aarch64).
_CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                    0x40000000)
# Address families a sandbox may open sockets of (local, IP, and netlink, which getaddrinfo
# and `ip` need); every other one is EAFNOSUPPORT. A network namespace does not isolate all
# of them: AF_VSOCK reaches the hypervisor, and others are rarely used kernel surface.
ALLOWED_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
_AF_MAX = 46
# Mode bits no file made or changed in the sandbox may carry (setuid, setgid): such a file in
# a write root would keep them on the host. Each call that sets a mode, by where the mode is.
_PRIVILEGE_BITS = (0o4000, 0o2000)
_MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1,
                  "mknodat": 2}
# open(2)-like calls: (flags argument, mode argument); the mode counts only with O_CREAT or
# O_TMPFILE. openat2 takes its mode inside a struct, which a filter cannot read: ENOSYS, on
# which every caller falls back to openat.
_CREATE_ARGUMENTS = {"open": (1, 2), "openat": (2, 3), "creat": (None, 1)}
_O_CREAT = 0o100
_O_TMPFILE = 0o20000000
# Calls that act on another process named by its pid (or thread id), 0 naming the caller:
# the call and the argument that names it. Where there is no pid namespace (the landlock
# tier), every other target is refused (`compile_filter(other_processes=False)`), the
# command's own children and threads included: a filter cannot tell them from the host's.
_PID_ARGUMENT = {"prlimit64": 0, "sched_setaffinity": 0, "sched_setscheduler": 0,
                 "sched_setparam": 0, "sched_setattr": 0, "move_pages": 0, "migrate_pages": 0,
                 "get_robust_list": 0}
# Calls that take (which, who): who 0 is the caller, or its own process group; the `user`
# form acts on every process of a user (who 0: the caller's), the host's too.
_WHO_ARGUMENTS = {"setpriority": 2, "ioprio_set": 3}  # -> the `which` of a user
# Calls that only ever name another process.
_OTHER_PROCESS_CALLS = ("kcmp", "process_mrelease")
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
# Calls that set or remove an extended attribute: Landlock does not govern them, so without
# a mount view they reach every file of the user's, user.overlay.* of a change set's layers
# in Stockade's state directory among them. EOPNOTSUPP, as a filesystem without them says.
XATTR_WRITES = ("setxattr", "lsetxattr", "fsetxattr", "setxattrat", "removexattr",
                "lremovexattr", "fremovexattr", "removexattrat")
# Calls that change a mode, by where the mode is. Landlock does not govern them either: without
# a mount view, a command could make any file of the user's writable by every other user
# (Stockade's state directory, a shell's startup file). World write is refused to them.
_CHMOD_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2}
_WORLD_WRITE = 0o002
# inotify: a watch needs only a path lookup and read permission, which Landlock does not
# govern, so without a mount view a watch outside the roots tells the command of the host's
# activity there. ENOSYS, as a kernel without inotify says: callers fall back to polling
# (`tail -f`, GLib), as they do for clone3 and openat2. (fanotify_init is refused everywhere.)
INOTIFY_CALLS = ("inotify_init", "inotify_init1", "inotify_add_watch")
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C
_LOW_32_BITS = 0xFFFFFFFF

_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_ACT_USER_NOTIF = 0x7FC00000
_ACT_ERRNO = 0x00050000
_ATTR_ACT_BADARCH = 2
_CMP_NE = 1
_CMP_MASKED_EQ = 7
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_GET_ACTION_AVAIL = 2
_BPF_INSN_SIZE = 8
_BPF_MAXINSNS = 4096

# One comparison of a call's argument, as libseccomp's struct scmp_arg_cmp: (arg, op, a, b).
Comparison = tuple[int, int, int, int]
# One rule: syscall name, errno, and comparisons that must all hold. Several rules for one
# syscall match if any of them does.
Rule = tuple[str, int, tuple[Comparison, ...]]


def masked(arg: int, mask: int, value: int) -> Comparison:
    """Argument `arg` & `mask` == `value`."""
    return (arg, _CMP_MASKED_EQ, mask, value)


def nonzero(arg: int) -> Comparison:
    """Argument `arg` != 0 (all 64 bits: a value whose low 32 bits are 0 but not its high ones
    matches too, which only ever refuses more)."""
    return (arg, _CMP_NE, 0, 0)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def compile_filter(unix_sockets: bool = True, internet: bool = True,
                   other_processes: bool = True, xattrs: bool = True,
                   world_write: bool = True, inotify: bool = True) -> bytes:
    """The classic BPF program for Stockade's policy on this architecture; without
    `unix_sockets`, no AF_UNIX socket can be made either (socketpair still can: it reaches
    nothing but itself). For a sandbox that shares the host's network and pid namespaces and
    its mounts (stockade/linux/landlock_tier.py): without `internet`, no socket of AF_INET,
    AF_INET6 or AF_NETLINK; without `other_processes`, no resource limit, priority, affinity,
    scheduling or memory placement of any process but the caller's own (`process_rules`);
    without `xattrs`, no extended attribute set or removed; without `world_write`, no mode
    that lets other users write (chmod and its kin: EPERM); without `inotify`, no inotify
    instance or watch (ENOSYS)."""
    rules = _rules(unix_sockets)
    if not internet:
        rules += [("socket", errno.EACCES, (masked(0, _LOW_32_BITS, ALLOWED_FAMILIES[name]),))
                  for name in ("AF_INET", "AF_INET6", "AF_NETLINK")]
    if not other_processes:
        rules += process_rules()
    if not xattrs:
        rules += [(call, errno.EOPNOTSUPP, ()) for call in XATTR_WRITES]
    if not world_write:
        rules += [(call, errno.EPERM, (masked(arg, _WORLD_WRITE, _WORLD_WRITE),))
                  for call, arg in _CHMOD_ARGUMENT.items()]
    if not inotify:
        rules += [(call, errno.ENOSYS, ()) for call in INOTIFY_CALLS]
    return compile_rules(rules)


def process_rules() -> list[Rule]:
    """EPERM for each call that would act on a process other than the caller (a nonzero pid),
    on a process group other than its own, or on every process of a user."""
    rules: list[Rule] = [(call, errno.EPERM, (nonzero(arg),))
                         for call, arg in _PID_ARGUMENT.items()]
    for call, user in _WHO_ARGUMENTS.items():
        rules.append((call, errno.EPERM, (nonzero(1),)))
        rules.append((call, errno.EPERM, (masked(0, _LOW_32_BITS, user),)))
    return rules + [(call, errno.EPERM, ()) for call in _OTHER_PROCESS_CALLS]


def compile_rules(rules: list[Rule]) -> bytes:
    """A classic BPF program that allows by default, kills foreign architectures, and answers
    each rule's call (when all its masked comparisons hold) with its errno."""
    lib = _libseccomp()
    _require_kernel_filters()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise UnavailableError("seccomp_unavailable", "seccomp_init failed")
    try:
        _check(lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, _ACT_KILL_PROCESS), "seccomp_attr_set")
        for name, err, comparisons in rules:
            nr = _resolve(lib, name)
            if nr is None:
                continue
            array = (_ArgCmp * len(comparisons))(*(_ArgCmp(*c) for c in comparisons))
            _check(lib.seccomp_rule_add_array(ctx, _ACT_ERRNO | err, nr, len(comparisons), array),
                   f"seccomp_rule_add_array({name})")
        fd = os.memfd_create("stockade-seccomp", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "seccomp_export_bpf")
            return os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def install(bpf: bytes) -> None:
    """Load `bpf` as the calling thread's seccomp filter (needs no_new_privs or CAP_SYS_ADMIN)."""
    count, rest = divmod(len(bpf), _BPF_INSN_SIZE)
    if rest or not 0 < count <= _BPF_MAXINSNS:
        raise ValueError(f"not a classic BPF program: {len(bpf)} bytes")
    program = ctypes.create_string_buffer(bpf, len(bpf))
    fprog = _SockFprog(count, ctypes.addressof(program))
    syscalls.syscall(syscalls.number("seccomp"), _SECCOMP_SET_MODE_FILTER, 0, ctypes.byref(fprog))


def describe() -> dict[str, object]:
    """What the filter denies on this host, or why there is no filter."""
    try:
        lib = _libseccomp()
        _require_kernel_filters()
    except UnavailableError as exc:
        return {"available": False, "code": exc.code, "reason": exc.message}
    version = lib.seccomp_version().contents
    numbers = {name: _resolve(lib, name) for name in DENIED_SYSCALLS}
    return {
        "available": True,
        "libseccomp": f"{version.major}.{version.minor}.{version.micro}",
        "default_action": "allow",
        "bad_arch_action": "kill_process",
        "eperm": {name: nr for name, nr in numbers.items() if nr is not None},
        "unknown_here": [name for name, nr in numbers.items() if nr is None],
        "enosys": ["clone3", "openat2"],
        "conditional_eperm": {
            "clone": "any CLONE_NEW* namespace flag",
            "ioctl": "TIOCSTI, TIOCLINUX",
            "personality": "anything but 0x0, 0x8 and 0xffffffff",
            **{call: "a setuid or setgid mode bit" for call in (*_MODE_ARGUMENT,
                                                                 *_CREATE_ARGUMENTS)},
        },
        "socket_families": sorted(ALLOWED_FAMILIES),
    }


def _rules(unix_sockets: bool = True) -> list[Rule]:
    rules: list[Rule] = [(name, errno.EPERM, ()) for name in DENIED_SYSCALLS]
    if not unix_sockets:
        rules.append(("socket", errno.EACCES,
                      (masked(0, _LOW_32_BITS, ALLOWED_FAMILIES["AF_UNIX"]),)))
    rules.append(("clone3", errno.ENOSYS, ()))
    rules.append(("openat2", errno.ENOSYS, ()))
    rules += [(call, errno.EAFNOSUPPORT, (masked(0, _LOW_32_BITS, family),))
              for call in ("socket", "socketpair") for family in range(_AF_MAX)
              if family not in ALLOWED_FAMILIES.values()]
    rules += [(call, errno.EPERM, (masked(arg, bit, bit),))
              for call, arg in _MODE_ARGUMENT.items() for bit in _PRIVILEGE_BITS]
    for call, (flags, mode) in _CREATE_ARGUMENTS.items():
        for bit in _PRIVILEGE_BITS:
            if flags is None:
                rules.append((call, errno.EPERM, (masked(mode, bit, bit),)))
            else:
                rules += [(call, errno.EPERM, (masked(flags, kind, kind), masked(mode, bit, bit)))
                          for kind in (_O_CREAT, _O_TMPFILE)]
    rules += [("clone", errno.EPERM, (masked(0, flag, flag),)) for flag in _CLONE_NEW_FLAGS]
    rules += [("ioctl", errno.EPERM, (masked(1, _LOW_32_BITS, request),))
              for request in (_TIOCSTI, _TIOCLINUX)]
    rules += [("personality", errno.EPERM, (masked(0, mask, value),))
              for mask, value in _personality_denials()]
    # pid 1 (the sandbox's own, whose watches answer the command's calls; the host's init in
    # the landlock tier) bears no limit, priority or placement the command chooses: its
    # RLIMIT_NOFILE set to 0 stopped it answering, and the launch failed.
    rules += [(call, errno.EPERM, (masked(arg, _LOW_32_BITS, 1),))
              for call, arg in _PID_ARGUMENT.items()]
    rules += [(call, errno.EPERM, (masked(0, _LOW_32_BITS, which), masked(1, _LOW_32_BITS, 1)))
              for call, which in (("setpriority", _PRIO_PROCESS),
                                  ("ioprio_set", _IOPRIO_WHO_PROCESS))]
    return rules


def _personality_denials() -> list[tuple[int, int]]:
    """(mask, value) tests that together match every persona except 0, 0x8 and 0xffffffff.

    libseccomp takes one comparison per argument per rule, so "not one of three values" is
    written as a cover of its complement. The kernel reads the persona as 32 bits. A value with
    both set and clear bits has a set bit followed by a clear one; "bit k set, bit k+1 clear"
    (cyclically) for every k but 3 catches it, unless its only such edge is at bit 3. Then its
    one run of set bits ends at bit 3, and, unless it is 0x8 itself, also covers bit 2 while bit
    4 is clear: the last test. None of these match 0, 0x8 or 0xffffffff.
    """
    edges = [(k, (k + 1) % 32) for k in range(32) if k != 3] + [(2, 4)]
    return [((1 << set_bit) | (1 << clear_bit), 1 << set_bit) for set_bit, clear_bit in edges]


def _resolve(lib: ctypes.CDLL, name: str) -> int | None:
    """The native number of `name`: libseccomp's, else Stockade's table (newer than the library)."""
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr >= 0:
        return nr
    try:
        return syscalls.number(name)
    except KeyError:
        return None


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        raise UnavailableError("seccomp_unavailable", "libseccomp.so.2 cannot be loaded") from None
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    return lib


def _require_kernel_filters() -> None:
    """UnavailableError unless the kernel takes filters that may kill the whole process."""
    refused = _action_refused(_ACT_KILL_PROCESS)
    if refused is not None:
        raise UnavailableError("seccomp_unavailable",
                               f"the kernel has no seccomp filters with kill_process "
                               f"({errno.errorcode.get(refused.errno, refused.errno)})")


# The architectures whose calling convention memwatch.c's filter reads (little-endian).
_WATCHED_MACHINES = ("x86_64", "aarch64")


@functools.cache
def user_notification_available() -> bool:
    """Whether the command's address-space requests can be shown to the sandbox's pid 1
    (stockade/linux/memwatch.c): seccomp user notification, on an architecture it reads."""
    return os.uname().machine in _WATCHED_MACHINES and _action_refused(_ACT_USER_NOTIF) is None


def _action_refused(action: int) -> OSError | None:
    """Why the kernel's filters cannot return `action`, or None if they can."""
    value = ctypes.c_uint32(action)
    try:
        syscalls.syscall(syscalls.number("seccomp"), _SECCOMP_GET_ACTION_AVAIL, 0,
                         ctypes.byref(value))
    except OSError as exc:
        return exc
    return None


def _check(result: int, what: str) -> None:
    if result < 0:
        raise OSError(-result, f"{what}: {os.strerror(-result)}")
