"""A model of one NTFS directory as the broker's manifest file sees it through Win32
(stockade/windows/manifestfile.py), for tests/test_windows_broker.py: CreateFileW, WriteFile,
ReadFile, FlushFileBuffers, GetFileInformationByHandle, GetSecurityInfo (with
GetSecurityDescriptorControl and LocalFree), CloseHandle, behaving as Microsoft documents them:

- CreateFileW with CREATE_NEW fails (ERROR_FILE_EXISTS) when anything is at the name, a link
  included; the file gets the security descriptor given in its SECURITY_ATTRIBUTES (a
  self-relative one, read by its header), nothing inherited.
- CreateFileW with OPEN_EXISTING: a missing name is ERROR_FILE_NOT_FOUND; a name being deleted
  (a handle opened with FILE_FLAG_DELETE_ON_CLOSE still open) ERROR_ACCESS_DENIED; a directory
  without FILE_FLAG_BACKUP_SEMANTICS ERROR_ACCESS_DENIED; a symbolic link is followed unless
  FILE_FLAG_OPEN_REPARSE_POINT, which opens the link itself; the access asked for (generic
  rights mapped) must be allowed by the file's DACL to a SID of the caller's token
  (`token_sids`: an AppContainer process is refused what no entry for its package SID allows);
  and it must agree with every open handle's sharing both ways (ERROR_SHARING_VIOLATION).
- FILE_FLAG_DELETE_ON_CLOSE (which needs DELETE access) removes the name the file was opened by
  once its last handle closes; so does SetFileInformationByHandle's FileDispositionInfo with
  DeleteFile set (DELETE access too), through the handle it is given.
- GetFileInformationByHandle gives the attributes (a link's are FILE_ATTRIBUTE_REPARSE_POINT),
  the volume serial, the file index, the size and the number of names.

And what another process of the same user could do to a name between the host's write and the
broker's consume: `replace` (another file at the name), `link` (a second name), `move`,
`symlink`, `mkdir`, `remove`, `hold` (keep it open) and `widen` (add an entry to its DACL).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import operator
from dataclasses import dataclass, field

from test_windows_fakes import EVERYONE, LOGON, USER, USERS, out, win32_error

from stockade.launch.hostpaths import upcase
from stockade.windows import acl, structs
from stockade.windows import constants as c
from stockade.windows.acl import Ace, Dacl

SERIAL = 0x5EC0A1D3
FILE_READ_DATA, FILE_WRITE_DATA, FILE_APPEND_DATA, FILE_EXECUTE = 0x1, 0x2, 0x4, 0x20
_READS, _WRITES = FILE_READ_DATA | FILE_EXECUTE, FILE_WRITE_DATA | FILE_APPEND_DATA


@dataclass(eq=False)
class Node:
    index: int
    dacl: Dacl
    kind: str = "file"  # file, dir or symlink
    target: str = ""  # a symbolic link's: the name it stands for
    data: bytearray = field(default_factory=bytearray)


@dataclass
class Open:
    node: Node
    name: str  # (upcased) the name it was opened by
    access: int  # mapped
    share: int
    delete_on_close: bool
    position: int = 0


class Volume:
    def __init__(self, token_sids: tuple[str, ...] = (USER, USERS, EVERYONE, LOGON)) -> None:
        self.token_sids = token_sids
        self.names: dict[str, Node] = {}
        self.handles: dict[int, Open] = {}
        self.descriptors: dict[int, tuple[ctypes.Array, int]] = {}
        self.calls: list[str] = []
        self._index = itertools.count(0x10001)
        self._handle = itertools.count(0x400, 4)

    # --- what is there ------------------------------------------------------------------------
    def node(self, path: str) -> Node:
        return self.names[upcase(path)]

    def exists(self, path: str) -> bool:
        return upcase(path) in self.names

    def links(self, node: Node) -> int:
        return sum(1 for found in self.names.values() if found is node)

    # --- another process of this user, between write and consume ----------------------------
    def replace(self, path: str, data: bytes | None = None) -> None:
        """Another file at `path` (a new file index), with the old one's content and DACL
        unless `data` is given."""
        old = self.names.get(upcase(path))
        self.names[upcase(path)] = Node(next(self._index), old.dacl if old else self._users(),
                                        data=bytearray(old.data if data is None else data))

    def remove(self, path: str) -> None:
        del self.names[upcase(path)]

    def link(self, existing: str, new: str) -> None:
        self.names[upcase(new)] = self.node(existing)

    def move(self, old: str, new: str) -> None:
        self.names[upcase(new)] = self.names.pop(upcase(old))

    def symlink(self, path: str, target: str) -> None:
        self.names[upcase(path)] = Node(next(self._index), self._users(), "symlink",
                                        upcase(target))

    def mkdir(self, path: str) -> None:
        self.names[upcase(path)] = Node(next(self._index), self._users(), "dir")

    def hold(self, path: str, share: int = 0) -> int:
        """Another process keeps `path` open for reading, sharing `share`."""
        handle = next(self._handle)
        self.handles[handle] = Open(self.node(path), upcase(path), FILE_READ_DATA, share, False)
        return handle

    def widen(self, path: str, sid: str, mask: int) -> None:
        node = self.node(path)
        node.dacl = Dacl((*node.dacl.aces, Ace.allow(sid, mask)), node.dacl.protected,
                         node.dacl.auto_inherited)

    def _users(self) -> Dacl:
        """What a file this user makes in the directory gets: its entries, inherited."""
        return Dacl((Ace.allow(USER, c.FILE_ALL_ACCESS, acl.INHERITED),))

    # --- Win32 ---------------------------------------------------------------------------------
    def CreateFileW(self, path, access, share, security, disposition, flags, template):  # noqa: N802
        self.calls.append("CreateFileW")
        name = upcase(path)
        wanted = acl.mapped(access)
        if disposition == c.CREATE_NEW:
            if name in self.names:
                raise win32_error(c.ERROR_FILE_EXISTS, "CreateFileW")
            node = Node(next(self._index), _given(security))
            self.names[name] = node
        else:
            assert disposition == c.OPEN_EXISTING
            node = self.names.get(name)
            if node is None:
                raise win32_error(c.ERROR_FILE_NOT_FOUND, "CreateFileW")
            if node.kind == "symlink" and not flags & c.FILE_FLAG_OPEN_REPARSE_POINT:
                name, node = node.target, self.names.get(node.target)
                if node is None:
                    raise win32_error(c.ERROR_FILE_NOT_FOUND, "CreateFileW")
            if any(o.node is node and o.delete_on_close for o in self.handles.values()):
                raise win32_error(c.ERROR_ACCESS_DENIED, "CreateFileW")  # (delete pending)
            if node.kind == "dir" and not flags & c.FILE_FLAG_BACKUP_SEMANTICS:
                raise win32_error(c.ERROR_ACCESS_DENIED, "CreateFileW")
            allowed = functools.reduce(operator.or_, (acl.allowed(node.dacl.aces, sid)
                                                      for sid in self.token_sids), 0)
            if wanted & ~allowed:
                raise win32_error(c.ERROR_ACCESS_DENIED, "CreateFileW")
            if any(o.node is node and _conflict(o, wanted, share)
                   for o in self.handles.values()):
                raise win32_error(c.ERROR_SHARING_VIOLATION, "CreateFileW")
        if flags & c.FILE_FLAG_DELETE_ON_CLOSE:
            assert wanted & c.DELETE, "FILE_FLAG_DELETE_ON_CLOSE needs DELETE access"
        handle = next(self._handle)
        self.handles[handle] = Open(node, name, wanted, share,
                                    bool(flags & c.FILE_FLAG_DELETE_ON_CLOSE))
        return handle

    def CloseHandle(self, handle):  # noqa: N802
        self.calls.append("CloseHandle")
        opened = self.handles.pop(handle)
        if opened.delete_on_close and self.names.get(opened.name) is opened.node:
            del self.names[opened.name]
        return 1

    def WriteFile(self, handle, data, size, written, overlapped):  # noqa: N802
        opened = self.handles[handle]
        assert opened.access & FILE_WRITE_DATA
        opened.node.data[opened.position:opened.position + size] = bytes(data)[:size]
        opened.position += size
        out(written, size)
        return 1

    def ReadFile(self, handle, buffer, size, read, overlapped):  # noqa: N802
        opened = self.handles[handle]
        assert opened.access & FILE_READ_DATA
        chunk = bytes(opened.node.data[opened.position:opened.position + size])
        ctypes.memmove(buffer, chunk, len(chunk))
        opened.position += len(chunk)
        out(read, len(chunk))
        return 1

    def SetFileInformationByHandle(self, handle, kind, info, size):  # noqa: N802
        opened = self.handles[handle]
        assert kind == c.FILE_DISPOSITION_INFO_CLASS and opened.access & c.DELETE
        assert size == ctypes.sizeof(structs.FILE_DISPOSITION_INFO)
        opened.delete_on_close = bool(info._obj.DeleteFile)
        return 1

    def FlushFileBuffers(self, handle):  # noqa: N802
        return 1

    def GetFileInformationByHandle(self, handle, info):  # noqa: N802
        node = self.handles[handle].node
        attributes = {"file": c.FILE_ATTRIBUTE_NORMAL, "dir": c.FILE_ATTRIBUTE_DIRECTORY,
                      "symlink": c.FILE_ATTRIBUTE_REPARSE_POINT}[node.kind]
        answer = info._obj
        answer.dwFileAttributes, answer.dwVolumeSerialNumber = attributes, SERIAL
        answer.nFileSizeHigh, answer.nFileSizeLow = len(node.data) >> 32, len(node.data)
        answer.nNumberOfLinks = self.links(node)
        answer.nFileIndexHigh, answer.nFileIndexLow = node.index >> 32, node.index & 0xFFFFFFFF
        return 1

    def GetSecurityInfo(self, handle, kind, info, owner, group, dacl, sacl, descriptor):  # noqa: N802
        opened = self.handles[handle]
        assert kind == c.SE_FILE_OBJECT and info == c.DACL_SECURITY_INFORMATION
        assert opened.access & c.READ_CONTROL
        buffer = ctypes.create_string_buffer(acl.encode(opened.node.dacl.aces))
        self.descriptors[ctypes.addressof(buffer)] = (buffer, opened.node.dacl.control)
        out(dacl, ctypes.addressof(buffer))
        out(descriptor, ctypes.addressof(buffer))
        return 0

    def GetSecurityDescriptorControl(self, descriptor, control, revision):  # noqa: N802
        out(control, self.descriptors[descriptor.value][1])
        return 1

    def LocalFree(self, pointer):  # noqa: N802
        self.descriptors.pop(pointer.value)


def _given(security) -> Dacl:
    """The DACL of the self-relative descriptor a SECURITY_ATTRIBUTES points to."""
    attributes = security._obj
    address = attributes.lpSecurityDescriptor
    header = structs.SECURITY_DESCRIPTOR_RELATIVE.from_buffer_copy(ctypes.string_at(address, 20))
    assert header.Control & c.SE_SELF_RELATIVE and header.Control & c.SE_DACL_PRESENT
    size = int.from_bytes(ctypes.string_at(address + header.Dacl + 2, 2), "little")
    return Dacl.with_control(acl.decode(ctypes.string_at(address + header.Dacl, size)),
                             header.Control)


def _conflict(opened: Open, wanted: int, share: int) -> bool:
    """Whether an open for `wanted`, sharing `share`, conflicts with `opened`, either way."""
    def needs(access: int, shared: int) -> bool:
        return bool(access & _READS and not shared & c.FILE_SHARE_READ
                    or access & _WRITES and not shared & c.FILE_SHARE_WRITE
                    or access & c.DELETE and not shared & c.FILE_SHARE_DELETE)
    return needs(wanted, opened.share) or needs(opened.access, share)
