"""Call one family of kernel interfaces that seccomp withholds (the argument names it): new
namespaces, mounts, clone3, keyrings, bpf, perf events, userfaultfd, io_uring. Any call that
succeeds is an escape."""

import os
import struct

from _common import ARGS, MARKER, NR, attempt, checked, libc, pointer, syscall

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x20000, 0x10000000, 0x40000000, 17


def new_process(call, *args):
    """A clone-like call: the copy exits at once, the original reaps it."""
    pid = call(*args)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return f"created process {pid} in new namespaces"


def in_a_child(action):
    """Run `action` in a child of ours, so that what it changes (a namespace joined, a root
    changed) does not decide the attempts after it; its errno is ours."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            answer = f"ok {action()}"
        except OSError as exc:
            answer = f"errno {exc.errno or 0}"
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
            answer = f"error {exc!r}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reply:
        kind, _, detail = reply.read().decode().partition(" ")
    os.waitpid(pid, 0)
    if kind == "errno":
        raise OSError(int(detail), os.strerror(int(detail)))
    if kind != "ok":
        raise RuntimeError(detail or "the child died")
    return detail


def clone3(flags):
    args = struct.pack("<QQQQQQQQ", flags, 0, 0, 0, SIGCHLD, 0, 0, 0)
    return new_process(syscall, NR["clone3"], pointer(args), len(args))


def mount_target():
    return ARGS[1].encode()


FAMILIES = {
    "namespaces": [
        ("unshare(CLONE_NEWUSER)", lambda: checked(libc.unshare(CLONE_NEWUSER))),
        ("unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWNET)",
         lambda: checked(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET))),
        ("clone(CLONE_NEWUSER)",
         lambda: new_process(syscall, NR["clone"], CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
        ("setns(/proc/self/ns/user)",
         lambda: checked(libc.setns(os.open("/proc/self/ns/user", os.O_RDONLY), 0))),
    ],
    "mount": [
        ("mount tmpfs", lambda: syscall(NR["mount"], pointer(b"none\0"),
                                        pointer(mount_target() + b"\0"), pointer(b"tmpfs\0"),
                                        0, 0)),
        ("bind-mount / over the target", lambda: syscall(
            NR["mount"], pointer(b"/\0"), pointer(mount_target() + b"\0"), 0, 0x1000, 0)),
        ("umount2 /proc", lambda: syscall(NR["umount2"], pointer(b"/proc\0"), 2)),
        ("fsopen tmpfs", lambda: syscall(NR["fsopen"], pointer(b"tmpfs\0"), 0)),
        ("open_tree / (clone)", lambda: syscall(NR["open_tree"], -100, pointer(b"/\0"), 1)),
        ("pivot_root", lambda: syscall(NR["pivot_root"], pointer(b"/tmp\0"), pointer(b"/tmp\0"))),
        ("chroot /tmp", lambda: syscall(NR["chroot"], pointer(b"/tmp\0"))),
    ],
    "clone3": [
        ("clone3(CLONE_NEWUSER)", lambda: clone3(CLONE_NEWUSER)),
        ("clone3(plain)", lambda: clone3(0)),
    ],
    "keyctl": [
        ("add_key", lambda: syscall(NR["add_key"], pointer(b"user\0"),
                                    pointer(MARKER.encode() + b"\0"), pointer(b"x"), 1, -2)),
        ("keyctl(GET_KEYRING_ID, session)", lambda: syscall(NR["keyctl"], 0, -3, 1)),
    ],
    "bpf": [
        ("bpf(MAP_CREATE)", lambda: syscall(NR["bpf"], 0,
                                            pointer(struct.pack("<IIII", 2, 4, 4, 1)), 16)),
        ("bpf(PROG_LOAD socket filter)", lambda: syscall(NR["bpf"], 5, pointer(
            struct.pack("<IIQQIIQ", 1, 2, pointer(struct.pack("<QQ", 0xB7, 0x95)),
                        pointer(b"GPL\0"), 0, 0, 0)), 40)),
    ],
    "perf_event_open": [
        # A software clock counting only this process in user mode: allowed at paranoid 2.
        ("perf_event_open(task clock, self)", lambda: syscall(NR["perf_event_open"], pointer(
            struct.pack("<IIQQQQQ", 1, 64, 1, 0, 0, 0, 1 | 1 << 5 | 1 << 6) + bytes(16)),
            0, -1, -1, 0)),
    ],
    "userfaultfd": [
        ("userfaultfd(UFFD_USER_MODE_ONLY)", lambda: syscall(NR["userfaultfd"], 1 | 0o2000000)),
        ("open /dev/userfaultfd", lambda: os.open("/dev/userfaultfd", os.O_RDWR)),
    ],
    # (for a user who cannot open /dev/userfaultfd on the host either: its mode refuses it)
    "userfaultfd-call": [
        ("userfaultfd(UFFD_USER_MODE_ONLY)", lambda: syscall(NR["userfaultfd"], 1 | 0o2000000)),
    ],
    "io_uring": [
        ("io_uring_setup(1)", lambda: syscall(NR["io_uring_setup"], 1, pointer(bytes(120)))),
    ],
}

ISOLATED = ("namespaces", "mount")  # families whose attempts change the process
for name, action in FAMILIES[ARGS[0]]:
    attempt(name, (lambda a=action: in_a_child(a)) if ARGS[0] in ISOLATED else action)
