"""The real DACL store (aclstore.py) driven through its Win32 calls (issue 31, D11), over a model
volume: a handle binds the file its name denoted when CreateFileW opened it, whatever the name
denotes later, as on NTFS. What a grant reads, identifies and writes is that one file: a name
swapped right after the open changes nothing of it, and the file put in its place is left
alone."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
import types

import pytest
from test_windows_aceplan import PACKAGE, RX, workspace
from test_windows_fakes import USER, USERS, FakeTree, Node, out

from stockade.lifecycle.removers import RemovalError
from stockade.windows import aceplan, acl, aclstore, fsinfo, grants, structs
from stockade.windows import constants as c
from stockade.windows.acl import Ace

OPEN_FLAGS = c.FILE_FLAG_BACKUP_SEMANTICS | c.FILE_FLAG_OPEN_REPARSE_POINT


class FileHandles:
    """CreateFileW and the security functions over a FakeTree; the C runtime's descriptors
    (msvcrt) and fstat over the handles. Windows' documented behaviour modelled: a handle
    stays on its file; GetSecurityInfo allocates the descriptor the caller frees with
    LocalFree; SetSecurityInfo writes the explicit entries (the store derives the rest)."""

    def __init__(self, tree: FakeTree) -> None:
        self.tree = tree
        self.handles: dict[int, Node] = {}
        self.descriptors: dict[int, tuple[ctypes.Array, int]] = {}
        self.kernel_writes: list[tuple[str, int]] = []
        self.fds: dict[int, int] = {}
        self.opened: list[tuple[str, int, int]] = []
        self.access: dict[int, int] = {}
        self.fsctls: list[tuple[str, int, bytes]] = []
        self.after_open = lambda path: None
        self._next = itertools.count(0x100, 4)

    def CreateFileW(self, path, access, share, security, disposition, flags, template):  # noqa: N802
        try:
            node = self.tree.node(path)
        except FileNotFoundError:
            error = FileNotFoundError(2, f"CreateFileW: {path}")
            error.winerror = 2
            raise error from None
        handle = next(self._next)
        self.handles[handle] = node
        self.access[handle] = access
        self.opened.append((path, access, flags))
        self.after_open(path)
        return handle

    def CloseHandle(self, handle):  # noqa: N802
        del self.handles[handle]
        return 1

    def _answer(self, node: Node, dacl_ref, descriptor_ref) -> int:
        dacl = self.tree.read_node(node)
        buffer = ctypes.create_string_buffer(acl.encode(dacl.aces))
        self.descriptors[ctypes.addressof(buffer)] = (buffer, dacl.control)
        out(dacl_ref, ctypes.addressof(buffer))
        out(descriptor_ref, ctypes.addressof(buffer))
        return 0

    def GetSecurityInfo(self, handle, kind, info, owner, group, dacl, sacl, descriptor):  # noqa: N802
        assert kind == c.SE_FILE_OBJECT and info == c.DACL_SECURITY_INFORMATION
        return self._answer(self.handles[handle], dacl, descriptor)

    def GetNamedSecurityInfoW(self, path, kind, info, owner, group, dacl, sacl, descriptor):  # noqa: N802
        return self._answer(self.tree.node(path), dacl, descriptor)

    def GetSecurityDescriptorControl(self, descriptor, control, revision):  # noqa: N802
        out(control, self.descriptors[descriptor.value][1])
        return 1

    def LocalFree(self, pointer):  # noqa: N802
        self.descriptors.pop(pointer.value)

    def DeviceIoControl(self, handle, code, data, size, output, room, returned, overlapped):  # noqa: N802
        """The reparse-point FSCTLs (MS-FSCC 2.3): GET fills a REPARSE_DATA_BUFFER (here the
        tag, the data length, then the name it stands for); DELETE takes the header alone, its
        tag the point's and its data length zero, and leaves an empty directory; SET puts the
        data back. DELETE and SET need FILE_WRITE_DATA or FILE_WRITE_ATTRIBUTES."""
        node = self.handles[handle]
        self.fsctls.append((node.path, code, bytes(data[:size]) if data else b""))
        if code == c.FSCTL_GET_REPARSE_POINT:
            if not node.reparse_tag:
                raise OSError(None, "FSCTL_GET_REPARSE_POINT: not a reparse point")
            name = node.target.encode("utf-16-le")
            answer = node.reparse_tag.to_bytes(4, "little") + len(name).to_bytes(2, "little") \
                + bytes(2) + name
            ctypes.memmove(output, answer, len(answer))
            out(returned, len(answer))
            return 1
        assert self.access[handle] & c.FILE_WRITE_ATTRIBUTES
        tag = int.from_bytes(data[:4], "little")
        if code == c.FSCTL_DELETE_REPARSE_POINT:
            assert size == 8 and tag == node.reparse_tag and data[4:6] == bytes(2)
            node.reparse_tag, node.target = 0, ""
        else:
            assert code == c.FSCTL_SET_REPARSE_POINT and not node.reparse_tag
            length = int.from_bytes(data[4:6], "little")
            node.reparse_tag, node.target = tag, bytes(data[8:8 + length]).decode("utf-16-le")
        return 1

    def SetSecurityInfo(self, handle, kind, info, owner, group, dacl, sacl):  # noqa: N802
        assert kind == c.SE_FILE_OBJECT and info & c.DACL_SECURITY_INFORMATION
        self.tree.write_node(self.handles[handle], acl.decode(dacl.raw),
                             bool(info & c.PROTECTED_DACL_SECURITY_INFORMATION))
        return 0

    def SetKernelObjectSecurity(self, handle, info, descriptor):  # noqa: N802
        """The descriptor stored as given (a self-relative one read by its documented
        header, SECURITY_DESCRIPTOR_RELATIVE): needs WRITE_DAC; with DACL_SECURITY_INFORMATION
        its DACL and the DACL's control bits, the (UN)PROTECTED flag agreeing with them."""
        assert self.access[handle] & c.WRITE_DAC and info & c.DACL_SECURITY_INFORMATION
        data = bytes(descriptor.raw)
        header = structs.SECURITY_DESCRIPTOR_RELATIVE.from_buffer_copy(data)
        assert header.Revision == c.SECURITY_DESCRIPTOR_REVISION
        assert header.Control & (c.SE_SELF_RELATIVE | c.SE_DACL_PRESENT) == (
            c.SE_SELF_RELATIVE | c.SE_DACL_PRESENT)
        assert (header.Owner, header.Group, header.Sacl) == (0, 0, 0)
        protected = bool(header.Control & c.SE_DACL_PROTECTED)
        assert info & (c.PROTECTED_DACL_SECURITY_INFORMATION if protected
                       else c.UNPROTECTED_DACL_SECURITY_INFORMATION)
        node = self.handles[handle]
        self.kernel_writes.append((node.path, info))
        self.tree.restore_node(node, acl.Dacl.with_control(acl.decode(data[header.Dacl:]),
                                                           header.Control))
        return 1

    # msvcrt and fstat: a descriptor owns its handle
    def open_osfhandle(self, handle: int, flags: int) -> int:
        fd = os.open(os.devnull, os.O_RDONLY)
        self.fds[fd] = handle
        return fd

    def get_osfhandle(self, fd: int) -> int:
        return self.fds[fd]

    def fstat(self, fd, real=os.fstat):
        return self._stat(self.handles[self.fds[fd]]) if fd in self.fds else real(fd)

    def lstat(self, path, real=os.lstat):
        return self._stat(self.tree.node(path)) if path.startswith("C:\\") else real(path)

    @staticmethod
    def _stat(node: Node) -> types.SimpleNamespace:
        volume, index = node.file_id.split(":")
        return types.SimpleNamespace(st_dev=int(volume, 16), st_ino=int(index, 16))


@pytest.fixture
def handles(monkeypatch) -> FileHandles:
    win = FileHandles(workspace())
    monkeypatch.setattr(aclstore, "win32", lambda: win)
    monkeypatch.setitem(sys.modules, "msvcrt", types.SimpleNamespace(
        open_osfhandle=win.open_osfhandle, get_osfhandle=win.get_osfhandle))
    monkeypatch.setattr(os, "fstat", win.fstat)
    monkeypatch.setattr(os, "lstat", win.lstat)  # (a file's id by name, for contrast)
    monkeypatch.setattr(fsinfo, "scan", win.tree.scan)  # (listings: the model volume's)
    monkeypatch.setattr(fsinfo, "entry", win.tree.entry)
    return win


def swap(tree: FakeTree, path: str, intruder: str) -> None:
    """`intruder` renamed into `path`'s place (the admitted file moved aside)."""
    moved = tree.nodes.pop(tree.key(path))
    moved.path = path + ".old"
    tree.nodes[tree.key(moved.path)] = moved
    node = tree.nodes.pop(tree.key(intruder))
    node.path = path
    tree.nodes[tree.key(path)] = node


def test_a_grant_goes_through_the_handle_to_the_file_admitted(handles):
    """The name is swapped right after CreateFileW: the grant still lands on the admitted file,
    through that handle (its identity from the handle too, so the launch is not refused), and
    the file now at the name keeps its DACL. A store identifying or writing by name fails this
    (refused, or the intruder granted)."""
    tree = handles.tree
    root, intruder = "C:\\Users\\u\\ws\\src", "C:\\Users\\u\\outside"
    admitted, stranger = tree.nodes[tree.key(root)], tree.nodes[tree.key(intruder)]
    before = stranger.explicit
    handles.after_open = lambda path: swap(tree, root, intruder) if path == root else None
    walked = {root: admitted.file_id}
    step = aceplan.Step(root, aceplan.GRANT, aceplan.root_aces(PACKAGE, False, False))
    added = []
    grants.apply([step], PACKAGE, aclstore.WindowsAclStore(),
                 types.SimpleNamespace(add=lambda *record: added.append(record)),
                 lambda path: contextlib.nullcontext(), walked)
    assert admitted.explicit[-1] == Ace.allow(PACKAGE, RX, acl.OBJECT_INHERIT
                                              | acl.CONTAINER_INHERIT)
    assert stranger.explicit == before and not tree.access(root, PACKAGE)
    assert added[0][2]["file_id"] == admitted.file_id
    assert handles.opened == [(root, c.READ_CONTROL | c.WRITE_DAC, OPEN_FLAGS)]


def test_revert_acts_on_the_opened_file_and_refuses_another(handles):
    tree = handles.tree
    root = "C:\\Users\\u\\ws\\src"
    node = tree.nodes[tree.key(root)]
    store = aclstore.WindowsAclStore()
    step = aceplan.Step(root, aceplan.GRANT, aceplan.root_aces(PACKAGE, False, False))
    added = []
    grants.apply([step], PACKAGE, store, types.SimpleNamespace(
        add=lambda *record: added.append(record)),
        lambda path: contextlib.nullcontext(), {root: node.file_id})
    (_, _, detail), = added
    stranger = tree.node("C:\\Users\\u\\outside")
    tree.nodes[tree.key(root)] = stranger  # (another file at the name)
    before = stranger.explicit
    with pytest.raises(RemovalError):
        grants.revert(root, detail, store)
    assert stranger.explicit == before and acl.allowed(tree.read_node(node).aces, PACKAGE) == RX
    tree.nodes[tree.key(root)] = node  # (the admitted file back at its name)
    grants.revert(root, detail, store)
    assert tree.access(root, PACKAGE) == 0
    del tree.nodes[tree.key(root)]
    grants.revert(root, detail, store)  # gone: done
    assert [path for path, _, _ in handles.opened] == [root] * 3


def test_a_revert_sets_each_reparse_point_below_aside_and_puts_it_back(handles):
    """WINREAD 7 through aclstore's own calls: a junction the child made below the workspace is
    opened itself, its data read, removed while the DACL is written (so the propagation, which
    the model follows through a junction, does not reach the folder it names) and put back."""
    tree = handles.tree
    root, outside = "C:\\Users\\u\\ws", "C:\\Users\\u\\outside"
    store = aclstore.WindowsAclStore()
    # (The workspace passes Users read to what is below it; the user's profile does not.)
    tree.node(root).explicit += (Ace.allow(USERS, RX, acl.OBJECT_INHERIT
                                           | acl.CONTAINER_INHERIT),)
    step = aceplan.Step(root, aceplan.GRANT, aceplan.root_aces(PACKAGE, True, False))
    added = []
    grants.apply([step], PACKAGE, store, types.SimpleNamespace(
        add=lambda *record: added.append(record)),
        lambda path: contextlib.nullcontext(), {root: tree.node(root).file_id})
    junction = tree.add(root + "\\src\\j", reparse_tag=c.IO_REPARSE_TAG_MOUNT_POINT,
                        target=outside, owner=tree.node(root).owner)
    tree.node(outside).explicit = (Ace.allow(PACKAGE, RX, acl.OBJECT_INHERIT
                                             | acl.CONTAINER_INHERIT),)  # (open to the child)
    before = {path: tree.read(path) for path in (outside, outside + "\\notes")}
    (_, _, detail), = added
    grants.revert(root, detail, store)
    assert {path: tree.read(path) for path in before} == before  # (before: inherited from ws)
    assert tree.node(junction).target == outside
    data = tree.node(junction).reparse_tag.to_bytes(4, "little")
    assert [(path, code, sent[:4]) for path, code, sent in handles.fsctls] == [
        (junction, c.FSCTL_GET_REPARSE_POINT, b""),
        (junction, c.FSCTL_DELETE_REPARSE_POINT, data),
        (junction, c.FSCTL_SET_REPARSE_POINT, data)]
    assert (junction, c.FILE_READ_ATTRIBUTES | c.FILE_WRITE_ATTRIBUTES, OPEN_FLAGS) \
        in handles.opened


def test_a_junction_is_deleted_by_its_tag_alone():
    junction = c.IO_REPARSE_TAG_MOUNT_POINT.to_bytes(4, "little") + b"\x10\0\0\0" + bytes(16)
    assert aclstore.deletion(junction) == junction[:4] + bytes(4)
    third = (0x00000123).to_bytes(4, "little") + (20).to_bytes(2, "little") + bytes(22)
    for data in (junction[:6], third):
        with pytest.raises(ValueError):
            aclstore.deletion(data)


@pytest.mark.parametrize("tag", [c.IO_REPARSE_TAG_SYMLINK, 0x00000123,
                                 c.IO_REPARSE_TAG_APPEXECLINK])
def test_a_reparse_point_other_than_a_junction_refuses_the_revert_untouched(handles, tag):
    """Putting a symbolic link's data back (FSCTL_SET_REPARSE_POINT) takes
    SeCreateSymbolicLinkPrivilege, which a standard user lacks, and another tag's data is its
    filter's: set aside, either could not be restored. So the revert is refused, typed, before
    any reparse point is touched, and its record kept."""
    tree = handles.tree
    root = "C:\\Users\\u\\ws"
    store = aclstore.WindowsAclStore()
    step = aceplan.Step(root, aceplan.GRANT, aceplan.root_aces(PACKAGE, True, False))
    added = []
    grants.apply([step], PACKAGE, store, types.SimpleNamespace(
        add=lambda *record: added.append(record)),
        lambda path: contextlib.nullcontext(), {root: tree.node(root).file_id})
    tree.add(root + "\\src\\j", reparse_tag=c.IO_REPARSE_TAG_MOUNT_POINT,
             target="C:\\Users\\u\\outside")
    link = tree.file(root + "\\src\\link", reparse_tag=tag, target="C:\\Users\\u\\outside")
    during = tree.snapshot()
    (_, _, detail), = added
    with pytest.raises(RemovalError, match="link"):
        grants.revert(root, detail, store)
    assert handles.fsctls == [] and tree.snapshot() == during
    assert tree.node(link).reparse_tag == tag


def test_a_shields_revert_writes_the_recorded_descriptor_back_through_the_handle(handles):
    """Issue 31, item A, through aclstore's Win32 calls: the shield is recorded with the
    file's whole DACL and control bits (GetSecurityInfo, GetSecurityDescriptorControl) and
    reverted with SetKernelObjectSecurity on a handle opened as the file itself
    (FILE_FLAG_OPEN_REPARSE_POINT), the recorded descriptor verbatim; SetSecurityInfo, which
    derives inherited entries from a parent, is never asked to unprotect it."""
    tree = handles.tree
    tree.inherit_by_name = True
    path = "C:\\Users\\u\\ws\\lib.py"
    tree.link("C:\\Users\\u\\outside\\notes", path)
    node = tree.node(path)
    node.auto_inherited = False
    before = tree.read(path)
    store = aclstore.WindowsAclStore()
    added = []
    grants.apply([aceplan.Step(path, aceplan.SHIELD, ())], PACKAGE, store,
                 types.SimpleNamespace(add=lambda *record: added.append(record)),
                 lambda path: contextlib.nullcontext(), {path: node.file_id})
    (_, _, detail), = added
    assert detail["control"] == before.control == 0 and tree.read(path).protected
    assert detail["prior"] == [a.hex() for a in before.aces]
    grants.revert(path, detail, store)
    assert acl.self_relative(tree.read(path)) == acl.self_relative(before)
    assert handles.kernel_writes == [(node.path, c.DACL_SECURITY_INFORMATION
                                      | c.UNPROTECTED_DACL_SECURITY_INFORMATION)]
    assert handles.opened[-1] == (path, c.READ_CONTROL | c.WRITE_DAC, OPEN_FLAGS)
    grants.revert(path, detail, store)  # (again: nothing to do)
    assert len(handles.kernel_writes) == 1


def test_a_self_relative_descriptor_is_laid_out_as_documented():
    """SECURITY_DESCRIPTOR_RELATIVE (winnt.h): revision 1, a zero byte, the control word
    (SE_SELF_RELATIVE, SE_DACL_PRESENT and the DACL's own bits), then the owner's, group's,
    SACL's and DACL's offsets from its start: no owner, group or SACL (0), the DACL at 20."""
    aces = (Ace.allow(USER, RX), Ace.allow(PACKAGE, RX, acl.INHERITED))
    data = acl.self_relative(acl.Dacl(aces, protected=True, auto_inherited=True))
    assert data[:20] == bytes([1, 0]) + (0x8000 | 0x0004 | 0x1000 | 0x0400).to_bytes(2, "little") \
        + bytes(12) + (20).to_bytes(4, "little")
    assert acl.decode(data[20:]) == aces and len(data) == 20 + len(acl.encode(aces))
    assert acl.self_relative(acl.Dacl((), auto_inherited=False))[2:4] == b"\x04\x80"
