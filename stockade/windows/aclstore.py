"""DACLs on the Windows filesystem, as grants.py's AclStore.

A DACL is changed only through a handle (`opened`): the file is opened once, never through a
reparse point (FILE_FLAG_OPEN_REPARSE_POINT; FILE_FLAG_BACKUP_SEMANTICS, which a directory
needs), and its DACL read (GetSecurityInfo), its identity taken (the volume serial and file index
of that same handle) and its DACL written (SetSecurityInfo; a shield's put back verbatim,
SetKernelObjectSecurity) all through that handle, so whatever
the name denotes meanwhile, all three concern one file. By name, a file replaced (or a junction
put in its place) between reading its identity and writing would have received the change.
`read(path)` (GetNamedSecurityInfoW) is for judging a path only, never for a change.

`without_reparse_points` (for a revert, grants.py): each junction below a directory, found by
admission's walk (which never enters one), is opened itself (FILE_FLAG_OPEN_REPARSE_POINT),
its reparse data read (FSCTL_GET_REPARSE_POINT) and removed (FSCTL_DELETE_REPARSE_POINT, which
leaves the directory, empty), and put back through the same handle afterwards
(FSCTL_SET_REPARSE_POINT): meanwhile no propagation can pass through it. Process death in
between leaves it an empty directory: the link is lost, nothing else. Any other reparse point
there refuses the revert (RemovalError: the record is kept, reconciling tries again) before
any is set aside: putting a symbolic link's data back takes SeCreateSymbolicLinkPrivilege,
which a standard user lacks, and another tag's data belongs to its filter, which may refuse
it or read it differently; either would lose what the user made.

Only explicit entries are ever written: SetSecurityInfo, like SetNamedSecurityInfoW, derives the
inherited ones from the parent (unless the DACL is protected) and propagates the change to
everything below a directory ("Automatic Propagation of Inheritable ACEs"), which is what makes
an inheritable grant reach a whole root.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

from stockade.lifecycle.removers import RemovalError
from stockade.windows import acl, admission, fsinfo
from stockade.windows import constants as c
from stockade.windows.acl import Ace, Dacl
from stockade.windows.api import win32
from stockade.windows.structs import DWORD, PVOID, WORD


class WindowsAclStore:
    def read(self, path: str) -> Dacl:
        dacl, descriptor = PVOID(), PVOID()
        win32().GetNamedSecurityInfoW(fsinfo.win32_path(path), c.SE_FILE_OBJECT,
                                      c.DACL_SECURITY_INFORMATION, None, None,
                                      ctypes.byref(dacl), None, ctypes.byref(descriptor))
        return dacl_of(path, dacl, descriptor)

    @contextlib.contextmanager
    def opened(self, path: str) -> Iterator[OpenedFile]:
        import msvcrt  # Windows only

        handle = win32().CreateFileW(
            fsinfo.win32_path(path), c.READ_CONTROL | c.WRITE_DAC,
            c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE, None,
            c.OPEN_EXISTING, c.FILE_FLAG_BACKUP_SEMANTICS | c.FILE_FLAG_OPEN_REPARSE_POINT,
            None)
        try:
            fd = msvcrt.open_osfhandle(handle, os.O_RDONLY)  # the descriptor owns the handle
        except BaseException:
            win32().CloseHandle(handle)
            raise
        try:
            yield OpenedFile(path, fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def without_reparse_points(self, path: str) -> Iterator[None]:
        found = [entry for entry in admission.walk(path, fsinfo.scan, fsinfo.entry)
                 if admission.opaque(entry)]
        for entry in found:
            if entry.reparse_tag != c.IO_REPARSE_TAG_MOUNT_POINT:
                raise RemovalError(
                    f"{entry.path} (below {path}) is a reparse point of tag "
                    f"0x{entry.reparse_tag:08X}, made after the grant; only a junction can be "
                    "set aside for the revert and put back. Remove it, then run `stockade "
                    "reconcile`")
        with contextlib.ExitStack() as stack:
            for entry in found:
                stack.enter_context(_set_aside(entry.path))
            yield


@contextlib.contextmanager
def _set_aside(path: str) -> Iterator[None]:
    """The reparse point at `path` without its reparse data while this lasts."""
    api = win32()
    handle = api.CreateFileW(
        fsinfo.win32_path(path), c.FILE_READ_ATTRIBUTES | c.FILE_WRITE_ATTRIBUTES,
        c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE, None, c.OPEN_EXISTING,
        c.FILE_FLAG_BACKUP_SEMANTICS | c.FILE_FLAG_OPEN_REPARSE_POINT, None)
    try:
        saved = fsinfo.reparse_data(api, handle)
        header = deletion(saved)
        api.DeviceIoControl(handle, c.FSCTL_DELETE_REPARSE_POINT, header, len(header), None, 0,
                            ctypes.byref(DWORD()), None)
        try:
            yield
        finally:
            api.DeviceIoControl(handle, c.FSCTL_SET_REPARSE_POINT, saved, len(saved), None, 0,
                                ctypes.byref(DWORD()), None)
    finally:
        api.CloseHandle(handle)


def deletion(data: bytes) -> bytes:
    """What FSCTL_DELETE_REPARSE_POINT takes to remove the junction whose data (as
    FSCTL_GET_REPARSE_POINT returned it) is `data`: its tag and a data length of zero."""
    if len(data) < 8 or int.from_bytes(data[:4], "little") != c.IO_REPARSE_TAG_MOUNT_POINT:
        raise ValueError("not a junction's reparse data")
    return data[:4] + bytes(4)


class OpenedFile:
    """One file, opened once: its DACL and identity through that handle."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self._fd = path, fd

    def _handle(self) -> int:
        import msvcrt  # Windows only

        return msvcrt.get_osfhandle(self._fd)

    def read(self) -> Dacl:
        dacl, descriptor = PVOID(), PVOID()
        win32().GetSecurityInfo(self._handle(), c.SE_FILE_OBJECT, c.DACL_SECURITY_INFORMATION,
                                None, None, ctypes.byref(dacl), None, ctypes.byref(descriptor))
        return dacl_of(self.path, dacl, descriptor)

    def write(self, explicit: tuple[Ace, ...], protected: bool) -> None:
        data = ctypes.create_string_buffer(acl.encode(explicit))
        flags = c.DACL_SECURITY_INFORMATION | (c.PROTECTED_DACL_SECURITY_INFORMATION if protected
                                               else c.UNPROTECTED_DACL_SECURITY_INFORMATION)
        win32().SetSecurityInfo(self._handle(), c.SE_FILE_OBJECT, flags, None, None, data, None)

    def restore(self, dacl: Dacl) -> None:
        """`dacl` written verbatim through this handle (SetKernelObjectSecurity, a self-relative
        descriptor holding it and its control bits): unlike SetSecurityInfo, nothing is derived
        from a parent and nothing propagated. The protection is also asked for as
        (UN)PROTECTED_DACL_SECURITY_INFORMATION, so it is the recorded one either way."""
        data = ctypes.create_string_buffer(acl.self_relative(dacl))
        flags = c.DACL_SECURITY_INFORMATION | (
            c.PROTECTED_DACL_SECURITY_INFORMATION if dacl.protected
            else c.UNPROTECTED_DACL_SECURITY_INFORMATION)
        win32().SetKernelObjectSecurity(self._handle(), flags, data)

    def identity(self) -> str:
        """Volume serial and file index of the opened file, in the form the walk's entries
        carry (CPython's fstat and lstat read both from the file alike)."""
        return fsinfo.file_id(os.fstat(self._fd))


def dacl_of(path: str, dacl: PVOID, descriptor: PVOID) -> Dacl:
    """The DACL GetSecurityInfo (or GetNamedSecurityInfoW) gave, with its control bits; the
    descriptor freed."""
    api = win32()
    try:
        if not dacl.value:
            raise OSError(None, f"{path} has no DACL (everyone has full access); "
                                "Stockade will not change it")
        control, revision = WORD(), DWORD()
        api.GetSecurityDescriptorControl(descriptor, ctypes.byref(control),
                                         ctypes.byref(revision))
        return Dacl.with_control(aces_at(dacl.value), control.value)
    finally:
        api.LocalFree(descriptor)


def aces_at(address: int) -> tuple[Ace, ...]:
    """The entries of the binary ACL at `address` (its size is in its header)."""
    size = int.from_bytes(ctypes.string_at(address + 2, 2), "little")
    return acl.decode(ctypes.string_at(address, size))
