"""What the launch ledger needs from the platform: a record's lease, and facts about its files.

A lease is an exclusive lock on a record's open descriptor, dropped by the kernel if its holder
dies. POSIX: `flock`, and records opened without following a symbolic link; ownership and
permission bits come from `stat`, and a directory is fsync'd after its entries change.

Windows: the lease is a `msvcrt.locking` lock on the record's first byte (mandatory: nobody
reads a leased record), and records are opened with `CreateFileW` sharing delete access, so a
record can be renamed or unlinked while open as on POSIX, and without following a reparse
point. `stat` carries no owner and no group or other write bits there, and a directory cannot
be fsync'd: those checks are skipped, and the state directory's DACL (inherited from the
user's profile) is what keeps other users out.
"""

from __future__ import annotations

import os
import stat
import sys

if sys.platform == "win32":
    import ctypes
    import functools
    import msvcrt
    from collections.abc import Callable

    OPEN_FLAGS = os.O_NOINHERIT | os.O_BINARY
    _GENERIC_READ, _GENERIC_WRITE = 0x80000000, 0x40000000
    _SHARE_ALL = 0x7  # read, write, delete
    _CREATE_NEW, _OPEN_EXISTING = 1, 3
    _OPEN_REPARSE_POINT = 0x00200000
    _INVALID_HANDLE = ctypes.c_void_p(-1).value

    @functools.cache
    def _create_file() -> Callable[..., int | None]:
        # Bound on first use, not at import: importing the ledger loads no DLL.
        function = ctypes.WinDLL("kernel32", use_last_error=True).CreateFileW
        function.restype = ctypes.c_void_p
        function.argtypes = [ctypes.c_wchar_p, ctypes.c_uint32, ctypes.c_uint32,
                             ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p]
        return function

    def open_record(path: str, flags: int) -> int:
        """A descriptor on the record at `path`: `flags` is O_RDWR, with O_CREAT | O_EXCL to
        create it."""
        handle = _create_file()(path, _GENERIC_READ | _GENERIC_WRITE, _SHARE_ALL, None,
                                _CREATE_NEW if flags & os.O_CREAT else _OPEN_EXISTING,
                                _OPEN_REPARSE_POINT, None)
        if handle in (None, _INVALID_HANDLE):
            raise ctypes.WinError(ctypes.get_last_error())
        return msvcrt.open_osfhandle(handle, os.O_RDWR | os.O_BINARY | os.O_NOINHERIT)

    def acquire(fd: int, *, wait: bool) -> None:
        """Take the lease; BlockingIOError if `wait` is false and another holds it. (With
        `wait`, msvcrt retries for about ten seconds before failing.)"""
        position = os.lseek(fd, 0, os.SEEK_CUR)
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
        except PermissionError:
            raise BlockingIOError("the record is leased") from None
        finally:
            os.lseek(fd, position, os.SEEK_SET)

    def read_at(fd: int, size: int, offset: int) -> bytes:
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)

    def sync_dir(path: str) -> None:
        """Nothing: Windows cannot fsync a directory (NTFS journals its entries)."""

    def owned(info: os.stat_result) -> bool:
        return True

    def private(info: os.stat_result) -> bool:
        return True

    def superuser() -> bool:
        return False

else:
    import fcntl

    OPEN_FLAGS = os.O_CLOEXEC  # for the ledger's other files: not inherited by children

    def open_record(path: str, flags: int) -> int:
        """A descriptor on the record at `path`, never through a symbolic link."""
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def acquire(fd: int, *, wait: bool) -> None:
        """Take the lease; BlockingIOError if `wait` is false and another holds it."""
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)

    def read_at(fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def sync_dir(path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def owned(info: os.stat_result) -> bool:
        """Whether this user owns the file `info` describes."""
        return info.st_uid == os.geteuid()

    def private(info: os.stat_result) -> bool:
        """Whether no group or other user may write it."""
        return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)

    def superuser() -> bool:
        return os.geteuid() == 0


def held(fd: int) -> int | None:
    """`fd` with the lease taken, or None (`fd` closed) when another process holds it."""
    try:
        acquire(fd, wait=False)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def distrust(info: os.stat_result) -> str | None:
    """Why the file `info` (from lstat) describes could have been planted or changed by someone
    else — a symbolic link, another owner, writable by others — or None if it could not."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not owned(info):
        return "is owned by another user"
    if not private(info):
        return "is writable by other users"
    return None
