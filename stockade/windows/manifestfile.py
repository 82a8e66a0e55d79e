"""The broker's manifest on disk (broker.py): a file that only this user's own processes can
open, never a sandbox, written once by the host and consumed once by its broker.

Written (`write`): CreateFileW with CREATE_NEW (nothing may be at the name, not even a link:
a name someone made first fails the write), no sharing, and the security descriptor given at
creation, so the file never has another one: a protected DACL of one entry, full control to
this user (`closed_dacl`). No entry names ALL APPLICATION PACKAGES, a package or capability
SID, another user or a group, and an AppContainer process is granted only what an entry for
its package SID or a capability it holds allows, so no sandbox opens it; it lies in the state
directory besides, which every launch denies. Its identity (volume serial and file index,
GetFileInformationByHandle) is taken through the same handle and goes to the broker with the
nonce, never in the file.

Consumed (`consume`): opened without sharing, never through a reparse point
(FILE_FLAG_OPEN_REPARSE_POINT: a link at the name is opened as itself), for reading and
deletion with FILE_FLAG_DELETE_ON_CLOSE: from that open on no other process can open it (no
sharing, then delete pending), and it is gone once the handle closes, whatever the broker then
decides, even if it dies. Through that handle it must be a plain file (no directory, no reparse
point) with one name, the very file the host wrote (its identity), with the closed DACL, and
within the bound; only then is it read. Otherwise `broker_manifest_missing` (nothing at the
name), `broker_manifest_replaced` (something else is there, or a file that cannot be opened
alone for reading and deletion: held by another process, already being deleted, or denied)
or `broker_frame_oversized`.

Left behind (`remove_left`): a host that dies after writing a manifest and before its broker
consumed it leaves the file. So the host records it in its launch's ledger record before it
writes it (`KIND`: the path, the broker's process id and creation time), and a reconcile — once
the host is gone, its record's lease free: `stockade reconcile`, or the readiness check of the
next launch — deletes it, but only once that broker has ended (procid.py: the very process, not
one that has its id since), only the file at that name itself (opened never through a reparse
point, alone, then deleted through that handle), and only if it is what a host writes: a plain
file of one name with the closed DACL, within the bound, holding a manifest bound to that broker
or nothing (the host died between creating and writing it). Anything else stays where it is,
the record kept (RemovalError).
"""

from __future__ import annotations

import ctypes
import ntpath
import re
import secrets
from dataclasses import dataclass

from stockade.errors import BrokerError
from stockade.lifecycle.removers import RemovalError
from stockade.windows import acl, procid
from stockade.windows import constants as c
from stockade.windows.acl import Ace, Dacl
from stockade.windows.aclstore import dacl_of
from stockade.windows.api import win32
from stockade.windows.fsinfo import win32_path
from stockade.windows.manifest import MAX_MANIFEST, decode_manifest
from stockade.windows.structs import (
    BY_HANDLE_FILE_INFORMATION,
    DWORD,
    FILE_DISPOSITION_INFO,
    PVOID,
    SECURITY_ATTRIBUTES,
)

KIND = "brokermanifest"  # the launch ledger's kind for a manifest written (records.py)
NAME = re.compile(r"[0-9a-f]{32}\.manifest")

_MISSING = {c.ERROR_FILE_NOT_FOUND, c.ERROR_PATH_NOT_FOUND}
_NOT_ALONE = {c.ERROR_ACCESS_DENIED, c.ERROR_SHARING_VIOLATION}
_CHUNK = 1 << 16


def closed_dacl(user_sid: str) -> Dacl:
    """The manifest's DACL: this user's alone, nothing inherited."""
    return Dacl((Ace.allow(user_sid, c.FILE_ALL_ACCESS),), protected=True, auto_inherited=False)


@dataclass(frozen=True)
class Written:
    path: str
    file_id: str  # volume serial and file index, as manifest.py's control frame carries it


@dataclass(frozen=True)
class Facts:
    """What the open handle says of the file it holds."""

    attributes: int
    links: int
    file_id: str


def refusal(facts: Facts, file_id: str | None, dacl: Dacl, user_sid: str) -> str | None:
    """Why the opened file is not the manifest the host wrote as `file_id` (None: a file the
    host may have written, as a reconcile knows it); None if it is."""
    if facts.attributes & (c.FILE_ATTRIBUTE_DIRECTORY | c.FILE_ATTRIBUTE_REPARSE_POINT):
        return "a directory or a reparse point (a link) is at its name"
    if facts.links != 1:
        return "the file at its name has more than one name"
    if file_id is not None and facts.file_id != file_id:
        return "the file at its name is not the one the host wrote"
    if not dacl.protected or dacl.aces != closed_dacl(user_sid).aces:
        return "the file at its name is open to more than this user"
    return None


def fresh_path(directory: str) -> str:
    """Where a new manifest goes in `directory` (a name never used: CREATE_NEW fails if it
    was)."""
    return ntpath.join(directory, f"{secrets.token_hex(16)}.manifest")


def write(path: str, data: bytes, user_sid: str) -> Written:
    """A fresh manifest at `path` holding `data`, closed from its creation on."""
    api = win32()
    descriptor = ctypes.create_string_buffer(acl.self_relative(closed_dacl(user_sid)))
    attributes = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES),
                                     ctypes.addressof(descriptor), 0)
    handle = api.CreateFileW(win32_path(path), c.GENERIC_WRITE | c.FILE_READ_ATTRIBUTES, 0,
                             ctypes.byref(attributes), c.CREATE_NEW, c.FILE_ATTRIBUTE_NORMAL,
                             None)
    try:
        count = DWORD()
        api.WriteFile(handle, data, len(data), ctypes.byref(count), None)
        if count.value != len(data):  # (a disk file's synchronous write is whole, or fails)
            raise OSError(None, f"WriteFile: {count.value} of {len(data)} bytes written")
        api.FlushFileBuffers(handle)
        return Written(path, _facts(api, handle).file_id)
    finally:
        api.CloseHandle(handle)


def consume(path: str, file_id: str, limit: int, user_sid: str) -> bytes:
    """The manifest at `path`, which must be the file `file_id`, read once and deleted."""
    api = win32()
    try:
        handle = api.CreateFileW(win32_path(path), c.GENERIC_READ | c.DELETE, 0, None,
                                 c.OPEN_EXISTING,
                                 c.FILE_FLAG_OPEN_REPARSE_POINT | c.FILE_FLAG_DELETE_ON_CLOSE,
                                 None)
    except OSError as exc:
        if exc.winerror in _MISSING:
            raise BrokerError("broker_manifest_missing", "no manifest is at its path") from None
        if exc.winerror in _NOT_ALONE:
            raise BrokerError("broker_manifest_replaced", "the manifest cannot be opened alone "
                              "for reading and deletion (another process holds it, it is being "
                              "deleted, or it is not the host's file)") from None
        raise
    try:
        why = refusal(_facts(api, handle), file_id, _dacl(api, handle, path), user_sid)
        if why:
            raise BrokerError("broker_manifest_replaced", why)
        return _read(api, handle, limit)  # (no other process can write it now)
    finally:
        api.CloseHandle(handle)  # (deletes it)


def discard(path: str) -> bool:
    """Delete a manifest its broker did not consume; whether something was still there (what
    cannot be opened for deletion stays, and counts)."""
    api = win32()
    try:
        handle = api.CreateFileW(win32_path(path), c.DELETE, 0, None, c.OPEN_EXISTING,
                                 c.FILE_FLAG_OPEN_REPARSE_POINT | c.FILE_FLAG_DELETE_ON_CLOSE,
                                 None)
    except OSError as exc:
        if exc.winerror in _MISSING:
            return False
        if exc.winerror in _NOT_ALONE:
            return True
        raise
    api.CloseHandle(handle)
    return True


def remove_left(path: str, broker: int, created: int, user_sid: str) -> None:
    """Delete the manifest a host recorded at `path` for its broker (process `broker`, created
    at `created`) and may have left (the module's docstring); RemovalError, the file as it
    is, where that cannot be done safely now or at all."""
    api = win32()
    if not _present(api, path):
        return  # consumed, or discarded by its host: its broker need not even be asked after
    if procid.running(broker, created):
        raise RemovalError("its broker still runs, and may be consuming it")
    try:
        handle = api.CreateFileW(win32_path(path), c.GENERIC_READ | c.DELETE, 0, None,
                                 c.OPEN_EXISTING, c.FILE_FLAG_OPEN_REPARSE_POINT, None)
    except OSError as exc:
        if exc.winerror in _MISSING:
            return  # (gone meanwhile)
        if exc.winerror in _NOT_ALONE:
            raise RemovalError("it cannot be opened alone (another process holds it, it is "
                               "being deleted, or it is not this user's)") from None
        raise
    try:
        why = refusal(_facts(api, handle), None, _dacl(api, handle, path), user_sid)
        if why is None:
            why = _not_for(_read(api, handle, MAX_MANIFEST), broker)
        if why:
            raise RemovalError(f"{why}; it is left as it is")
        delete = FILE_DISPOSITION_INFO(1)  # (through this handle: the very file proven)
        api.SetFileInformationByHandle(handle, c.FILE_DISPOSITION_INFO_CLASS,
                                       ctypes.byref(delete), ctypes.sizeof(delete))
    except BrokerError as exc:  # (past the bound)
        raise RemovalError(f"{exc.message}: it is left as it is") from None
    finally:
        api.CloseHandle(handle)


def _present(api, path: str) -> bool:
    """Whether anything is at `path` (a link itself), asked by an open for its attributes
    alone, which no sharing mode refuses nor is refused by: a broker consuming it is not
    disturbed."""
    try:
        handle = api.CreateFileW(win32_path(path), c.FILE_READ_ATTRIBUTES,
                                 c.FILE_SHARE_READ | c.FILE_SHARE_WRITE | c.FILE_SHARE_DELETE,
                                 None, c.OPEN_EXISTING,
                                 c.FILE_FLAG_OPEN_REPARSE_POINT | c.FILE_FLAG_BACKUP_SEMANTICS,
                                 None)
    except OSError as exc:
        return exc.winerror not in _MISSING  # (there, if it cannot be opened even so)
    api.CloseHandle(handle)
    return True


def _not_for(data: bytes, broker: int) -> str | None:
    """Why `data` is not what a host wrote for `broker` (nothing, if it died before writing)."""
    if not data:
        return None
    try:
        bound = decode_manifest(data).broker_pid
    except BrokerError as exc:
        return f"the file at its name is not a manifest a host wrote ({exc.code})"
    return None if bound == broker else "the manifest at its name is another broker's"


def _read(api, handle: int, limit: int) -> bytes:
    """The file's content from the start, to its end; `broker_frame_oversized` past `limit`."""
    data = bytearray()
    buffer, count = ctypes.create_string_buffer(_CHUNK), DWORD()
    while True:
        api.ReadFile(handle, buffer, _CHUNK, ctypes.byref(count), None)
        if not count.value:
            return bytes(data)
        data += buffer.raw[:count.value]
        if len(data) > limit:
            raise BrokerError("broker_frame_oversized",
                              f"the manifest is over its bound of {limit} bytes")


def _dacl(api, handle: int, path: str) -> Dacl:
    dacl, owned = PVOID(), PVOID()
    api.GetSecurityInfo(handle, c.SE_FILE_OBJECT, c.DACL_SECURITY_INFORMATION, None, None,
                        ctypes.byref(dacl), None, ctypes.byref(owned))
    return dacl_of(path, dacl, owned)


def _facts(api, handle: int) -> Facts:
    info = BY_HANDLE_FILE_INFORMATION()
    api.GetFileInformationByHandle(handle, ctypes.byref(info))
    index = info.nFileIndexHigh << 32 | info.nFileIndexLow
    return Facts(info.dwFileAttributes, info.nNumberOfLinks,
                 f"{info.dwVolumeSerialNumber:08x}-{index:016x}")
