"""The file-descriptor mount API (open_tree, mount_setattr, move_mount, fsopen/fsmount) and
openat2, through ctypes. Mounting through descriptors means a path is looked up once, without
following symlinks, and what was checked is what gets mounted.
"""

from __future__ import annotations

import ctypes
import os

from stockade.linux.syscalls import libc, number, syscall

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08

MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class _FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]  # MAX_HANDLE_SZ


def file_handle(fd: int) -> bytes:
    """The filesystem's handle for the object open at `fd` (name_to_handle_at): its inode and,
    where the filesystem keeps one, the inode's generation, which tells a directory re-made
    under a reused inode number from the old one. Empty where the filesystem has none."""
    handle, mount_id = _FileHandle(128, 0), ctypes.c_int()
    if libc.name_to_handle_at(fd, b"", ctypes.byref(handle), ctypes.byref(mount_id),
                              AT_EMPTY_PATH) != 0:
        return b""
    return handle.handle_type.to_bytes(4, "little", signed=True) + \
        bytes(handle.f_handle[:handle.handle_bytes])


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """Open `path` under `dirfd` with `resolve` restrictions (RESOLVE_*); returns an fd."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    return syscall(number("openat2"), dirfd, os.fsencode(path), ctypes.byref(how),
                   ctypes.sizeof(how))


def open_path_nofollow(path: str) -> int:
    """An O_PATH descriptor for absolute `path`, refusing any symlink on the way."""
    return openat2(AT_FDCWD, path, os.O_PATH,
                   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)


def clone_tree(fd: int, *, recursive: bool = True) -> int:
    """A detached copy of the mount (tree) at `fd`."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    return syscall(number("open_tree"), fd, b"", flags)


def set_attrs(fd: int, attr_set: int, *, recursive: bool = True, private: bool = True) -> None:
    """Add mount attributes (MOUNT_ATTR_*) to the mount (tree) at `fd`; never clears any."""
    attr = _MountAttr(attr_set, 0, MS_PRIVATE if private else 0, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    syscall(number("mount_setattr"), fd, b"", flags, ctypes.byref(attr), ctypes.sizeof(attr))


def attach(tree_fd: int, target_fd: int) -> None:
    """Mount the detached tree `tree_fd` on the object `target_fd` refers to."""
    syscall(number("move_mount"), tree_fd, b"", target_fd, b"",
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)


def new_fs(fstype: str, options: dict[str, str], attrs: int) -> int:
    """A fresh, detached filesystem instance (tmpfs, proc, devpts) as a mount fd."""
    fs_fd = syscall(number("fsopen"), fstype.encode(), 1)
    try:
        for key, value in options.items():
            syscall(number("fsconfig"), fs_fd, FSCONFIG_SET_STRING, key.encode(),
                    value.encode(), 0)
        syscall(number("fsconfig"), fs_fd, FSCONFIG_CMD_CREATE, None, None, 0)
        return syscall(number("fsmount"), fs_fd, 1, attrs)
    finally:
        os.close(fs_fd)


def make_rprivate(path: str = "/") -> None:
    """Stop mount events propagating between this namespace and the host."""
    if libc.mount(None, os.fsencode(path), None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def pivot_into(new_root: str) -> None:
    """Make `new_root` the root and detach the old root (pivot_root(".", ".") idiom)."""
    os.chdir(new_root)
    syscall(_pivot_root_nr(), b".", b".")
    if libc.umount2(b".", MNT_DETACH):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "old root")
    os.chdir("/")


def _pivot_root_nr() -> int:
    return {"x86_64": 155, "aarch64": 41}[os.uname().machine]
