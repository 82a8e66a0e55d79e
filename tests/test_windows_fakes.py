"""A model of an NTFS volume for the Windows backend's pure logic: a tree of files and
directories, each with explicit ACEs, a protected flag, a file id, a link count and reparse
attributes. Reading a DACL gives the explicit entries followed by the inherited ones, derived from
the parent as Windows propagates them (acl.inherit: generic rights mapped where effective,
split entries, CREATOR OWNER as the node's owner) unless the DACL is protected — which is what
SetNamedSecurityInfoW leaves on disk after propagating a change. A reparse point that stands for
another name (a junction) holds that name (`target`); a change written to a directory propagates
through it as modelled in `FakeTree.write_node`. It serves as grants.AclStore and
filesystem.Filesystem; `PersistentTree` keeps itself in a JSON file so a crashed process's
changes survive it.

Also here: SIDs used across the tests; `windows_kinds`, the Windows ledger kinds with removers
bound to a model volume, registered with the ledger as records.py does on Windows; and
`FakeWin32`, Win32 functions behaving as their documentation says (profiles, tokens, Jobs,
creating a process in a Job inside the owner's).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import ntpath
import operator
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import windows_dacls

from stockade.launch.hostpaths import upcase
from stockade.lifecycle import removers
from stockade.windows import acl, admission, desktop, grants, manifestfile, records
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace, Dacl
from stockade.windows.admission import Entry
from stockade.windows.structs import (
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION,
    JOBOBJECT_BASIC_UI_RESTRICTIONS,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
)

PACKAGE = "S-1-15-2-2067022373-1386325468-3431155434-2426632640-3089004462-2553425549-105248742"
OTHER_PACKAGE = "S-1-15-2-9-8-7-6-5-4-3"
USER = "S-1-5-21-1004336348-1177238915-682003330-1001"
ADMINS = "S-1-5-32-544"
USERS = "S-1-5-32-545"
SYSTEM = "S-1-5-18"
FULL = 0x1F01FF
EVERYONE = "S-1-1-0"
LOGON = "S-1-5-5-0-271828"  # a logon session's SID (S-1-5-5-X-Y)
WINSTA_CREATEDESKTOP = 0x0008
WINSTA_ALL = 0x037F  # every window-station right (winuser.h WINSTA_ALL_ACCESS)
PAGE_SIZE = 4096  # x64 and ARM64 Windows
CREATE_BREAKAWAY_FROM_JOB = 0x01000000  # (process creation flags; the backend never asks it)
BOTH = acl.OBJECT_INHERIT | acl.CONTAINER_INHERIT
FILE_WRITE_DATA = 0x0002  # (FILE_ADD_FILE on a directory)


@dataclass
class Node:
    path: str
    is_dir: bool
    explicit: tuple[Ace, ...] = ()
    protected: bool = False
    file_id: str = ""
    links: int = 1
    reparse_tag: int = 0
    owner: str = ADMINS  # (made by an administrator, unless said otherwise)
    # A directory's per-directory case sensitivity (FILE_CS_FLAG_CASE_SENSITIVE_DIR, set by
    # `fsutil file setCaseSensitiveInfo`, as WSL does for the directories it makes): names in
    # it are compared exactly, so `.git` and `.GIT` can both be there.
    case_sensitive: bool = False
    target: str = ""  # what a name surrogate's reparse data names (a junction's folder)
    # Inherited entries a propagation wrote here through another parent than the node's own
    # (a junction above it); None while they are its own parent's, derived when read.
    stamped: tuple[Ace, ...] | None = None
    # A file's other names (hard links, `FakeTree.link`): one node, so one security descriptor.
    names: list[str] = field(default_factory=list)
    # SE_DACL_AUTO_INHERITED, as a file made by inheritance or written by SetSecurityInfo has
    # it; one whose DACL was written by SetFileSecurity (an older tool's) may not.
    auto_inherited: bool = True


AUTHENTICATED_USERS, EVERYONE = "S-1-5-11", "S-1-1-0"
STANDARD_USER = (USER, USERS, AUTHENTICATED_USERS, EVERYONE)  # a standard user's token
ELEVATED = (*STANDARD_USER, ADMINS)  # an administrator's, elevated


@dataclass
class FakeTree:
    nodes: dict[str, Node] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)
    caller: tuple[str, ...] = STANDARD_USER  # the SIDs of the process asking
    # From which parent a file with several names takes its inherited entries when its DACL is
    # written unprotected through a handle is not documented: by default the model takes its
    # own (first) name's parent; with this set, the parent of the name it was opened by.
    inherit_by_name: bool = False

    @classmethod
    def volume(cls, edition: str = "windows11") -> FakeTree:
        """A drive root with the DACL it has on a stock `edition` (windows_dacls.py)."""
        tree = cls()
        protected, sddl = windows_dacls.STOCK[edition]["C:\\"]
        tree.add("C:\\", explicit=windows_dacls.aces(sddl), protected=protected)
        return tree

    @classmethod
    def stock(cls, edition: str = "windows11", user: str = USER) -> FakeTree:
        """A stock `edition`'s system volume as the backend meets it: C:\\Windows (with
        System32), C:\\Program Files, C:\\Users and the profile of `user`, C:\\Users\\u,
        each with its real DACL; and C:\\hostedtoolcache, as the runner image makes it."""
        tree = cls.volume(edition)
        for path, (protected, sddl) in windows_dacls.STOCK[edition].items():
            if path != "C:\\":
                tree.add(path, explicit=windows_dacls.aces(sddl), protected=protected)
        protected, sddl = windows_dacls.profile(user)
        tree.add("C:\\Users\\u", explicit=windows_dacls.aces(sddl), protected=protected,
                 owner=user)
        for path in ("C:\\Windows\\System32", "C:\\Program Files\\Python313",
                     "C:\\hostedtoolcache", "C:\\hostedtoolcache\\windows"):
            tree.add(path)
        for path in ("AppData", "AppData\\Local", "AppData\\Local\\Temp"):
            tree.add("C:\\Users\\u\\" + path, owner=user)
        for path in ("C:\\Windows\\System32\\cmd.exe",
                     "C:\\Program Files\\Python313\\python.exe"):
            tree.file(path)
        return tree

    def add(self, path: str, *, is_dir: bool = True, explicit: tuple[Ace, ...] = (),
            protected: bool = False, links: int = 1, reparse_tag: int = 0,
            owner: str = ADMINS, case_sensitive: bool = False, target: str = "") -> str:
        parent = ntpath.dirname(path)
        assert path == "C:\\" or self.key(parent) in self.nodes, f"no parent for {path}"
        assert self.key(path) not in self.nodes, f"{path}: Windows finds another entry by it"
        self.nodes[self.key(path)] = Node(path, is_dir, tuple(explicit), protected,
                                          f"1:{len(self.nodes) + 1:x}", links, reparse_tag,
                                          owner, case_sensitive, target)
        return path

    def file(self, path: str, **changes) -> str:
        return self.add(path, is_dir=False, **changes)

    def link(self, existing: str, new: str) -> str:
        """CreateHardLinkW: `new` another name of the file `existing`. NTFS keeps one security
        descriptor per file, not per name ("hard links" share the file's attributes and
        security), so every name reads and writes the same DACL."""
        node = self.node(existing)
        assert not node.is_dir and self.key(ntpath.dirname(new)) in self.nodes
        assert self.key(new) not in self.nodes
        self.nodes[self.key(new)] = node
        node.names.append(new)
        node.links += 1
        return new

    def key(self, path: str) -> str:
        """How NTFS finds `path`: each name compared through the volume's upcase table
        (hostpaths.upcase), or exactly where its directory is case-sensitive. Not
        `str.casefold`, which makes "straße" and "STRASSE" one name."""
        drive, *names = path.rstrip("\\").split("\\")
        key = upcase(drive) + "\\"
        for name in names:
            directory = self.nodes.get(key)
            name = name if directory is not None and directory.case_sensitive else upcase(name)
            key = key.rstrip("\\") + "\\" + name
        return key

    def node(self, path: str) -> Node:
        try:
            return self.nodes[self.key(path)]
        except KeyError:
            raise FileNotFoundError(path) from None

    # grants.AclStore
    def read(self, path: str) -> Dacl:
        return self.read_node(self.node(path))

    def read_node(self, node: Node) -> Dacl:
        inherited = self._inherited(node) if node.stamped is None else node.stamped
        return Dacl(node.explicit + inherited, node.protected, node.auto_inherited)

    def _inherited(self, node: Node) -> tuple[Ace, ...]:
        if node.protected or node.path == "C:\\":
            return ()
        parent = self.read(ntpath.dirname(node.path))
        return acl.inherit(parent.aces, node.is_dir, node.owner)

    @contextlib.contextmanager
    def opened(self, path: str) -> Iterator[Opened]:
        """The node `path` names now, opened: a handle stays on its file whatever the name
        names later (CreateFileW; with FILE_FLAG_OPEN_REPARSE_POINT, a reparse point is
        opened itself, not followed)."""
        yield Opened(self, self.node(path), path)

    def write(self, path: str, explicit: tuple[Ace, ...], protected: bool) -> None:
        self.write_node(self.node(path), explicit, protected)
        self.inherit_by(self.node(path), path)

    def inherit_by(self, node: Node, name: str) -> None:
        """With `inherit_by_name`, a file with several names, its DACL just written unprotected
        by `name`, takes its inherited entries from `name`'s parent."""
        if self.inherit_by_name and node.names and not node.protected:
            node.stamped = acl.inherit(self.read(ntpath.dirname(name)).aces, False, node.owner)

    def restore_node(self, node: Node, dacl: Dacl) -> None:
        """SetKernelObjectSecurity with DACL_SECURITY_INFORMATION: the DACL stored as given —
        inherited entries, protection and SE_DACL_AUTO_INHERITED included —, nothing derived
        from a parent, nothing propagated. (The model keeps explicit entries before inherited
        ones, as every DACL Windows derives has them.)"""
        explicit = dacl.explicit
        assert dacl.aces[:len(explicit)] == explicit, "explicit entries first"
        node.explicit, node.stamped = explicit, dacl.aces[len(explicit):]
        node.protected, node.auto_inherited = dacl.protected, dacl.auto_inherited
        self.writes.append(node.path)

    def write_node(self, node: Node, explicit: tuple[Ace, ...], protected: bool) -> None:
        """SetSecurityInfo: the explicit entries and protection set, then the inheritance model
        imposed "on the ACLs of all objects in the hierarchy below" ("Automatic Propagation of
        Inheritable ACEs"), reached by name. Whether that propagation opens a junction below as
        itself or as the folder it names is not documented; the model takes the worse: it
        follows it, so the folder it names gets its inherited entries from the junction's
        place (the wrong parent), and everything below that folder from it in turn."""
        assert not any(a.inherited for a in explicit), "only explicit entries are written"
        node.explicit, node.protected = tuple(explicit), protected
        node.stamped, node.auto_inherited = None, True
        self.writes.append(node.path)
        # (Entries derived when read are propagated already: only junctions and stamps matter.)
        if node.is_dir and any(n.target or n.names or n.stamped is not None
                               for n in self.nodes.values()):
            self._propagate(node, {node.path})

    def _propagate(self, directory: Node, seen: set[str]) -> None:
        for entry in self.scan(directory.path):
            child = self.node(entry.path)
            if child.protected:
                continue  # its inherited entries are none; below it, its own
            if child.reparse_tag and child.target:
                folder = self.node(child.target)
                if folder.path in seen or folder.protected:
                    continue
                seen.add(folder.path)
                folder.stamped = acl.inherit(self.read_node(child).aces, folder.is_dir,
                                             folder.owner)
                self._propagate(folder, seen)
                continue
            if child.names:
                # One descriptor for all its names: the propagation writes the inherited
                # entries of whichever parent it arrives from, by name (the last one stays).
                child.stamped = acl.inherit(self.read_node(directory).aces, False, child.owner)
                continue
            child.stamped = None  # its own parent's again
            if child.is_dir and not child.reparse_tag:
                self._propagate(child, seen)

    @contextlib.contextmanager
    def without_reparse_points(self, path: str) -> Iterator[None]:
        """grants.AclStore's: each junction below `path` without its reparse data while
        this lasts (any other reparse point refuses: RemovalError). FSCTL_DELETE_REPARSE_POINT
        (and FSCTL_SET_REPARSE_POINT, putting it back) need a handle with FILE_WRITE_DATA or
        FILE_WRITE_ATTRIBUTES (MS-FSA 2.1.5.10.3): PermissionError when the caller has
        neither."""
        found = [self.node(e.path) for e in admission.walk(path, self.scan, self.entry)
                 if admission.opaque(e)]
        for node in found:  # (only a junction's data can be put back: aclstore.py)
            if node.reparse_tag != c.IO_REPARSE_TAG_MOUNT_POINT:
                raise removers.RemovalError(f"{node.path}: not a junction")
        for node in found:
            if not any(self.access(node.path, sid) & (FILE_WRITE_DATA
                                                      | c.FILE_WRITE_ATTRIBUTES)
                       for sid in self.caller):
                raise PermissionError(13, f"FSCTL_DELETE_REPARSE_POINT: {node.path}")
        saved = [(node, node.reparse_tag, node.target) for node in found]
        for node in found:
            node.reparse_tag, node.target = 0, ""
        try:
            yield
        finally:
            for node, tag, target in saved:
                node.reparse_tag, node.target = tag, target

    def identity(self, path: str) -> str:
        return self.node(path).file_id

    # filesystem.Filesystem
    def entry(self, path: str) -> Entry:
        node = self.node(path)
        attributes = (0x10 if node.is_dir else 0) | (  # FILE_ATTRIBUTE_DIRECTORY
            c.FILE_ATTRIBUTE_REPARSE_POINT if node.reparse_tag else 0)
        name = next((n for n in node.names if self.key(n) == self.key(path)), node.path)
        return Entry(name, node.is_dir, attributes, node.reparse_tag, node.links,
                     node.file_id)

    def scan(self, directory: str) -> list[Entry]:
        prefix = self.key(directory).rstrip("\\") + "\\"
        children = [next(p for p in (n.path, *n.names) if self.key(p) == key)
                    for key, n in self.nodes.items()
                    if key.startswith(prefix) and "\\" not in key[len(prefix):]]
        return [self.entry(path) for path in sorted(children)]

    def filesystem(self, path: str) -> str:
        return "NTFS"

    def names(self, path: str) -> list[str]:
        """FindFirstFileNameW / FindNextFileNameW: every name of the file."""
        node = self.node(path)
        return [node.path, *node.names]

    def dacl_writable(self, path: str) -> bool:
        """Windows' answer for the caller: WRITE_DAC allowed by an entry for one of its SIDs,
        or implied by owning the object (no OWNER RIGHTS entry in these models)."""
        node = self.node(path)
        return node.owner in self.caller or any(
            self.access(path, sid) & c.WRITE_DAC for sid in self.caller)

    # for the tests
    def access(self, path: str, sid: str) -> int:
        return acl.allowed(self.read(path).aces, sid)

    def snapshot(self) -> dict[str, tuple[tuple[str, ...], bool]]:
        return {key: (tuple(a.hex() for a in n.explicit), n.protected)
                for key, n in self.nodes.items()}

    def to_json(self) -> str:
        unique = {id(n): n for n in self.nodes.values()}.values()  # a linked file once
        return json.dumps({"inherit_by_name": self.inherit_by_name, "nodes": [
            [n.path, n.is_dir, [a.hex() for a in n.explicit], n.protected, n.file_id, n.links,
             n.reparse_tag, n.owner, n.case_sensitive, n.target,
             None if n.stamped is None else [a.hex() for a in n.stamped], n.names,
             n.auto_inherited] for n in unique]})

    @classmethod
    def from_json(cls, text: str) -> FakeTree:
        saved = json.loads(text)
        tree = cls(inherit_by_name=saved["inherit_by_name"])
        for (path, is_dir, explicit, protected, file_id, links, tag, owner,
             case_sensitive, target, stamped, names, auto_inherited) in saved["nodes"]:
            node = Node(path, is_dir, tuple(Ace.from_hex(h) for h in explicit), protected,
                        file_id, links, tag, owner, case_sensitive, target,
                        None if stamped is None else tuple(Ace.from_hex(h) for h in stamped),
                        names, auto_inherited)
            for name in (path, *names):
                tree.nodes[tree.key(name)] = node
        return tree


@dataclass
class Opened:
    """grants.Opened over one node of a FakeTree."""

    tree: FakeTree
    node: Node

    def read(self) -> Dacl:
        return self.tree.read_node(self.node)

    name: str = ""  # the name it was opened by

    def write(self, explicit: tuple[Ace, ...], protected: bool) -> None:
        self.tree.write_node(self.node, explicit, protected)
        self.tree.inherit_by(self.node, self.name)

    def restore(self, dacl: Dacl) -> None:
        self.tree.restore_node(self.node, dacl)

    def identity(self) -> str:
        return self.node.file_id


class PersistentTree(FakeTree):
    """A FakeTree saved to `path` after every write; with `crash_after`, the process exits
    (no cleanup at all) instead of making write number `crash_after + 1`."""

    def __init__(self, path: str, crash_after: int | None = None) -> None:
        with open(path) as f:
            saved = FakeTree.from_json(f.read())
        super().__init__(nodes=saved.nodes, inherit_by_name=saved.inherit_by_name)
        self.path = path
        self.crash_after = crash_after

    @contextlib.contextmanager
    def _persisted(self) -> Iterator[None]:
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            os._exit(17)
        yield
        self._save()

    def _save(self) -> None:
        with open(self.path, "w") as f:
            f.write(self.to_json())

    def write_node(self, node: Node, explicit: tuple[Ace, ...], protected: bool) -> None:
        with self._persisted():
            super().write_node(node, explicit, protected)

    def inherit_by(self, node: Node, name: str) -> None:
        super().inherit_by(node, name)  # (the rest of the write before it: no crash between)
        self._save()

    def restore_node(self, node: Node, dacl: Dacl) -> None:
        with self._persisted():
            super().restore_node(node, dacl)


def windows_kinds(store, deleted: list[str]) -> dict:
    """The Windows ledger kinds, their removers bound to `store` (profiles are "deleted" by
    being listed in `deleted`)."""
    return {records.PROFILE_KIND: (records.validate_profile, lambda name, d: deleted.append(name)),
            grants.KIND: (records.validate_acl,
                          lambda name, detail: grants.revert(name, detail, store)),
            desktop.STATION_KIND: (records.validate_station, lambda name, detail: None),
            manifestfile.KIND: (records.validate_manifest, lambda name, detail: None)}


def install_kinds(kinds: dict) -> None:
    """Make the ledger accept and reconcile `kinds`, through the real registration (each
    registration replaces the one before, so every test installs its own)."""
    for kind, (validator, remover) in kinds.items():
        removers.register(kind, validator, remover)


def test_inheritance_stops_at_a_protected_dacl_and_resumes_below_it():
    tree = FakeTree.volume()
    tree.add("C:\\a", explicit=(Ace.allow(PACKAGE, c.FILE_MODIFY, BOTH),))
    tree.add("C:\\a\\b", protected=True, explicit=(Ace.allow(PACKAGE, 0x120089, BOTH),))
    tree.file("C:\\a\\b\\f")
    tree.file("C:\\a\\g")
    assert tree.access("C:\\a\\g", PACKAGE) == c.FILE_MODIFY
    assert tree.access("C:\\a\\b", PACKAGE) == 0x120089
    assert tree.access("C:\\a\\b\\f", PACKAGE) == 0x120089
    assert tree.access("C:\\a\\b\\f", SYSTEM) == 0  # protected: the volume's entries stop too


CREATOR = "S-1-5-21-1004336348-1177238915-682003330-500"  # an owner no stock entry names


def listing(tree: FakeTree, path: str) -> list[str]:
    """`path`'s DACL as icacls lists it (the trustees and rights used here), without the entry
    CREATOR OWNER becomes for the object's owner when that is CREATOR: whether Windows lists it
    beside an identical entry of the same trustee is not documented, so no test here says."""
    names = {CREATOR: "", windows_dacls.TRUSTED_INSTALLER: "TrustedInstaller", SYSTEM: "SYSTEM",
             ADMINS: "Administrators", USERS: "Users", "S-1-5-11": "Authenticated Users",
             "S-1-3-0": "CREATOR OWNER", sids.ALL_APP_PACKAGES: "ALL APPLICATION PACKAGES",
             sids.ALL_RESTRICTED_APP_PACKAGES: "ALL RESTRICTED APPLICATION PACKAGES"}
    rights = {0x1F01FF: "F", c.GENERIC_ALL: "F", c.FILE_MODIFY: "M", 0x1200A9: "RX",
              c.GENERIC_READ | c.GENERIC_EXECUTE: "GR,GE", 0x4: "AD", 0x2: "WD",
              c.DELETE | c.GENERIC_READ | c.GENERIC_WRITE | c.GENERIC_EXECUTE: "M"}
    flags = ((acl.INHERITED, "(I)"), (acl.OBJECT_INHERIT, "(OI)"),
             (acl.CONTAINER_INHERIT, "(CI)"), (acl.NO_PROPAGATE, "(NP)"),
             (acl.INHERIT_ONLY, "(IO)"))
    return [names[a.sid] + ":" + "".join(t for bit, t in flags if a.flags & bit)
            + f"({rights[a.mask]})" for a in tree.read(path).aces if a.sid != CREATOR]


def test_a_directory_below_program_files_inherits_what_icacls_shows_there():
    # A folder an installer made in C:\Program Files (as icacls lists one on Windows 11 and
    # Server 2022): each split pair of the parent becomes a mapped effective entry followed by
    # the inherit-only copy with the generic rights; CREATOR OWNER becomes the owner.
    for edition in windows_dacls.EDITIONS:
        tree = FakeTree.stock(edition)
        for path in ("C:\\Program Files\\Python313", "C:\\Program Files\\Python313\\python.exe"):
            tree.node(path).owner = CREATOR
        assert listing(tree, "C:\\Program Files\\Python313") == [
            "TrustedInstaller:(I)(F)", "TrustedInstaller:(I)(CI)(IO)(F)",
            "SYSTEM:(I)(F)", "SYSTEM:(I)(OI)(CI)(IO)(F)",
            "Administrators:(I)(F)", "Administrators:(I)(OI)(CI)(IO)(F)",
            "Users:(I)(RX)", "Users:(I)(OI)(CI)(IO)(GR,GE)", "CREATOR OWNER:(I)(OI)(CI)(IO)(F)",
            "ALL APPLICATION PACKAGES:(I)(RX)",
            "ALL APPLICATION PACKAGES:(I)(OI)(CI)(IO)(GR,GE)",
            "ALL RESTRICTED APPLICATION PACKAGES:(I)(RX)",
            "ALL RESTRICTED APPLICATION PACKAGES:(I)(OI)(CI)(IO)(GR,GE)"]
        # a file there: every entry effective, generic rights mapped
        assert listing(tree, "C:\\Program Files\\Python313\\python.exe") == [
            "SYSTEM:(I)(F)", "Administrators:(I)(F)", "Users:(I)(RX)",
            "ALL APPLICATION PACKAGES:(I)(RX)",
            "ALL RESTRICTED APPLICATION PACKAGES:(I)(RX)"]


def test_a_directory_made_below_the_drives_root_inherits_what_icacls_shows_there():
    windows11, server = FakeTree.stock("windows11"), FakeTree.stock("server2022")
    server.node("C:\\hostedtoolcache").owner = CREATOR
    assert listing(windows11, "C:\\hostedtoolcache") == [
        "Administrators:(I)(OI)(CI)(F)", "SYSTEM:(I)(OI)(CI)(F)", "Users:(I)(OI)(CI)(RX)",
        "Authenticated Users:(I)(M)", "Authenticated Users:(I)(OI)(CI)(IO)(M)"]
    assert listing(server, "C:\\hostedtoolcache") == [
        "SYSTEM:(I)(OI)(CI)(F)", "Administrators:(I)(OI)(CI)(F)", "Users:(I)(OI)(CI)(RX)",
        "Users:(I)(CI)(AD)", "Users:(I)(CI)(WD)", "CREATOR OWNER:(I)(OI)(CI)(IO)(F)"]
    assert server.access("C:\\hostedtoolcache", CREATOR) == FULL  # (CREATOR OWNER's, mapped)
    # No stock directory gives a standard user WRITE_DAC there (issue 31, D5).
    for tree in (windows11, server):
        for trustee in (USERS, "S-1-5-11"):
            assert not tree.access("C:\\hostedtoolcache\\windows", trustee) & c.WRITE_DAC


def test_scan_lists_direct_children_only_and_entries_carry_links_and_reparse_tags():
    tree = FakeTree.volume()
    tree.add("C:\\a")
    tree.file("C:\\a\\f", links=2)
    tree.add("C:\\a\\j", reparse_tag=0xA0000003)
    tree.file("C:\\a\\j\\deep")
    assert [e.name for e in tree.scan("C:\\a")] == ["f", "j"]
    assert tree.entry("C:\\a\\f").links == 2
    assert tree.entry("C:\\a\\j").attributes & c.FILE_ATTRIBUTE_REPARSE_POINT


# --- Win32 functions as documented, over in-memory state ---------------------------------------

def out(ref, value) -> None:
    """Write `value` through a ctypes.byref() argument, as a Win32 out parameter is written."""
    ref._obj.value = value


class FakeWin32:
    """The Win32 functions the backend calls, behaving as their documentation says, over
    in-memory state (bind it where a module calls `win32()`):

    - profiles: DeriveAppContainerSidFromAppContainerName derives a SID whether or not the
      profile exists; DeleteAppContainerProfile returns S_OK for a profile that does not exist
      ("Deleting a non-existent profile returns success") and leaves the storage of a profile a
      process still holds (`holding`); GetAppContainerFolderPath gives the local folder
      `...\\Packages\\<name>\\AC` (`folder_fails`: fail instead, which the documentation leaves
      open for a profile that does not exist);
    - tokens: GetTokenInformation writes a structure followed by the SID it points to into the
      caller's buffer; ConvertSidToStringSidW reads a SID only from memory that is still
      alive (a buffer this fake filled or allocated), so reading a freed buffer fails;
    - Jobs: IsProcessInJob with no Job asks whether the process is in any Job (this process:
      whether `owner_jobs`, the chain of Jobs it is in from its immediate one up, is not empty;
      a launched child always is); QueryInformationJobObject answers what
      SetInformationJobObject set (memory limits kept in whole pages), and the basic
      accounting's ActiveProcesses, which TerminateJobObject only starts bringing down (one
      process gone per query), as termination is asynchronous; given no Job, it answers about
      this process's immediate Job;
    - CreateProcessW with a JOB_LIST attribute, as "Nested Jobs" and AssignProcessToJobObject
      say: the child is first in each Job of its creator's chain, except that it breaks away
      from the immediate Job and each one above while they allow it (SILENT_BREAKAWAY_OK: no
      CREATE_BREAKAWAY_FROM_JOB is ever asked for); then it is put in each listed Job, and a
      process already in a Job goes into another only as a nested Job, which Windows forms
      only if neither sets UI limits: otherwise ERROR_ACCESS_DENIED, and no process.
      `image_denied`: the child's token may not execute the image (ERROR_ACCESS_DENIED too).
      `created` keeps each child's Jobs, innermost first;
    - window stations and desktops: OpenWindowStationW grants the access asked for only if the
      station's DACL (`stations`) allows all of it to a SID of this process's token
      (`token_sids`), else ERROR_ACCESS_DENIED; CreateDesktopExW needs WINSTA_CREATEDESKTOP on
      this process's window station (`station`) the same way. A station's DACL allows its
      logon session's SID and SYSTEM (`session_station`): a user logged on otherwise, as
      runas and Start-Process -Credential do, has a logon SID of its own and is granted nothing.
    """

    def __init__(self, package: str = PACKAGE) -> None:
        self.package = package
        self.profiles: set[str] = set()
        self.storage: set[str] = set()
        self.holding: set[str] = set()
        self.folder_fails = False
        self.calls: list[tuple] = []
        self._alive: list = []  # weak references to buffers holding SIDs
        self._allocated: dict[int, ctypes.Array] = {}
        self._names: dict[str, str] = {}  # derived SID -> profile name
        self.jobs: dict[int, dict] = {}
        self.owner_jobs: tuple[OwnerJob, ...] = ()
        self.image_denied = False
        self.created: list[tuple[int, ...]] = []
        self.desktops: list[str | None] = []  # each child's STARTUPINFO.lpDesktop
        self._attribute_lists: dict[int, dict[int, object]] = {}
        self.station = "WinSta0"
        self.stations: dict[str, tuple[Ace, ...]] = {"WinSta0": session_station(LOGON)}
        self.token_sids: tuple[str, ...] = (USER, USERS, EVERYONE, LOGON)
        self._open_stations: dict[int, str] = {}

    # memory
    def _sid_buffer(self, sid: str) -> int:
        buffer = ctypes.create_string_buffer(sids.to_bytes(sid))
        self._allocated[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def _live(self, address: int) -> bool:
        regions = [b for b in self._allocated.values()] + [r() for r in self._alive]
        return any(b is not None and ctypes.addressof(b) <= address
                   < ctypes.addressof(b) + len(b) for b in regions)

    def ConvertSidToStringSidW(self, psid, ref):  # noqa: N802 -- Win32 names
        address = getattr(psid, "value", psid)
        if not address or not self._live(address):
            raise AssertionError("ConvertSidToStringSidW read memory that is no longer alive")
        out(ref, sids.from_bytes(ctypes.string_at(address, 8 + 4 * 15))[0])
        return 1

    def LocalFree(self, pointer):  # noqa: N802
        return None

    def FreeSid(self, psid):  # noqa: N802
        self._allocated.pop(getattr(psid, "value", psid), None)

    def CoTaskMemFree(self, pointer):  # noqa: N802
        self._allocated.pop(getattr(pointer, "value", pointer), None)

    # profiles
    def folder(self, name: str) -> str:
        return f"C:\\Users\\u\\AppData\\Local\\Packages\\{name}\\AC"

    def derived(self, name: str) -> str:
        """The package SID of profile `name`: fixed by the name alone, as Windows derives it."""
        digest = hashlib.sha256(name.encode()).digest()
        return "S-1-15-2-" + "-".join(str(int.from_bytes(digest[4 * i:4 * i + 4], "little"))
                                      for i in range(7))

    def DeriveAppContainerSidFromAppContainerName(self, name, ref):  # noqa: N802
        self._names[self.derived(name)] = name
        out(ref, self._sid_buffer(self.derived(name)))
        return 0

    def CreateAppContainerProfile(self, name, display, description, caps, count, ref):  # noqa
        if name in self.profiles:
            return c.HRESULT_ALREADY_EXISTS - (1 << 32)  # an HRESULT is a signed long
        self.profiles.add(name)
        self.storage.add(ntpath.dirname(self.folder(name)))
        out(ref, self._sid_buffer(self.derived(name)))
        return 0

    def DeleteAppContainerProfile(self, name):  # noqa: N802
        self.calls.append(("DeleteAppContainerProfile", name))
        self.profiles.discard(name)
        if name not in self.holding:
            self.storage.discard(ntpath.dirname(self.folder(name)))
        return 0  # S_OK, whether or not the profile existed

    def GetAppContainerFolderPath(self, sid, ref):  # noqa: N802
        name = self._names.get(sid)
        if self.folder_fails or name is None:
            return 0x80070002 - (1 << 32)  # HRESULT_FROM_WIN32(ERROR_FILE_NOT_FOUND)
        text = ctypes.create_unicode_buffer(self.folder(name))
        self._allocated[ctypes.addressof(text)] = text
        out(ref, ctypes.addressof(text))
        return 0

    def is_dir(self, path: str) -> bool:
        return path in self.storage

    def mapped(self, sid: str) -> bool:
        """Whether the registry still maps `sid` to a profile (its Mappings key)."""
        return self._names.get(sid) in self.profiles

    # tokens
    def token_answers(self, is_appcontainer: int, package: str,
                      capabilities: tuple[str, ...] = ()) -> None:
        self._token = {c.TOKEN_IS_APP_CONTAINER: is_appcontainer,
                       c.TOKEN_APP_CONTAINER_SID: package,
                       c.TOKEN_CAPABILITIES: capabilities}

    def GetCurrentProcess(self):  # noqa: N802
        return -1

    def OpenProcessToken(self, process, access, ref):  # noqa: N802
        out(ref, 0x44)
        return 1

    def CloseHandle(self, handle):  # noqa: N802
        self.calls.append(("CloseHandle", getattr(handle, "value", handle)))
        return 1

    def IsProcessInJob(self, process, job, ref):  # noqa: N802
        out(ref, int(bool(self.owner_jobs)) if process == self.GetCurrentProcess()
            and job is None else 1)
        return 1

    def GetTokenInformation(self, token, info_class, buffer, size, returned):  # noqa: N802
        value = self._token[info_class]
        if info_class == c.TOKEN_APP_CONTAINER_SID:
            sid = sids.to_bytes(value) if value else b""
            needed = 8 + len(sid)
        elif info_class == c.TOKEN_CAPABILITIES:  # TOKEN_GROUPS, its SIDs after the array
            held = [sids.to_bytes(cap) for cap in value]
            needed = 8 + 16 * len(held) + sum(map(len, held))
        else:
            needed = 4
        if buffer is None or size < needed:
            out(returned, needed)
            # Raised without a local naming it: a cycle through this frame would keep the
            # caller's frame, and so its buffers, alive past their time.
            raise win32_error(c.ERROR_INSUFFICIENT_BUFFER, "GetTokenInformation")
        if info_class == c.TOKEN_APP_CONTAINER_SID:
            pointer = ctypes.addressof(buffer) + 8 if value else 0
            ctypes.memmove(buffer, pointer.to_bytes(8, "little") + sid, needed)
            self._alive.append(weakref.ref(buffer))
        elif info_class == c.TOKEN_CAPABILITIES:
            at = ctypes.addressof(buffer) + 8 + 16 * len(held)
            body = len(held).to_bytes(8, "little")
            for sid in held:
                body += at.to_bytes(8, "little") + c.SE_GROUP_ENABLED.to_bytes(8, "little")
                at += len(sid)
            ctypes.memmove(buffer, body + b"".join(held), needed)
            self._alive.append(weakref.ref(buffer))
        else:
            ctypes.memmove(buffer, value.to_bytes(4, "little"), 4)
        out(returned, needed)
        return 1

    # Jobs
    def CreateJobObjectW(self, attributes, name):  # noqa: N802
        handle = 0x100 + 4 * len(self.jobs)
        self.jobs[handle] = {"set": {}, "active": 0, "terminating": False}
        return handle

    def SetInformationJobObject(self, job, info_class, ref, size):  # noqa: N802
        self.jobs[job]["set"][info_class] = ctypes.string_at(ctypes.addressof(ref._obj), size)
        return 1

    def QueryInformationJobObject(self, job, info_class, ref, size, returned):  # noqa: N802
        if job is None:  # this process's immediate Job
            if not self.owner_jobs:
                raise win32_error(c.ERROR_INVALID_HANDLE, "QueryInformationJobObject")
            ctypes.memmove(ctypes.addressof(ref._obj), self.owner_jobs[0].settings(info_class),
                           size)
            return 1
        state = self.jobs[job]
        if info_class == c.JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION:
            if state["terminating"] and state["active"]:
                state["active"] -= 1
            info = JOBOBJECT_BASIC_ACCOUNTING_INFORMATION(ActiveProcesses=state["active"])
            data = bytes(info)
        elif info_class == c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION:
            info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION.from_buffer_copy(
                state["set"].get(info_class, bytes(size)))
            # Bytes in and out, but kept in whole pages (commitment's granularity,
            # SYSTEM_INFO.dwPageSize): what is off a page boundary comes back without its tail.
            info.JobMemoryLimit -= info.JobMemoryLimit % PAGE_SIZE
            info.ProcessMemoryLimit -= info.ProcessMemoryLimit % PAGE_SIZE
            data = bytes(info)
        else:
            data = state["set"].get(info_class, bytes(size))
        ctypes.memmove(ctypes.addressof(ref._obj), data, size)
        return 1

    def breaks_away(self, job: int, flags: int) -> bool:
        """Whether a process in `job` (its immediate Job) that creates a child with `flags`
        has that child outside it: with CREATE_BREAKAWAY_FROM_JOB, when the Job has
        JOB_OBJECT_LIMIT_BREAKAWAY_OK; without, when it has SILENT_BREAKAWAY_OK
        (JOBOBJECT_BASIC_LIMIT_INFORMATION). Outside it the child keeps none of its limits,
        its UI restrictions included."""
        limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION.from_buffer_copy(self.jobs[job]["set"].get(
            c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION, bytes(JOBOBJECT_EXTENDED_LIMIT_INFORMATION())
        )).BasicLimitInformation.LimitFlags
        if flags & CREATE_BREAKAWAY_FROM_JOB:
            return bool(limits & c.JOB_OBJECT_LIMIT_BREAKAWAY_OK)
        return bool(limits & c.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK)

    def TerminateJobObject(self, job, code):  # noqa: N802
        self.jobs[job]["terminating"] = True
        return 1

    # creating a process
    def InitializeProcThreadAttributeList(self, buffer, count, flags, size):  # noqa: N802
        if buffer is None:  # asked its size: "fails with ERROR_INSUFFICIENT_BUFFER" by design
            out(size, 64 * count)
            return 0
        self._attribute_lists[ctypes.addressof(buffer)] = {}
        return 1

    def UpdateProcThreadAttribute(self, buffer, flags, attribute, value, size, *unused):  # noqa
        self._attribute_lists[ctypes.addressof(buffer)][attribute] = value._obj
        return 1

    def DeleteProcThreadAttributeList(self, buffer):  # noqa: N802
        del self._attribute_lists[ctypes.addressof(buffer)]

    def CreateProcessW(self, application, command_line, process_attributes,  # noqa: N802
                       thread_attributes, inherit, flags, environment, cwd, startup, info):
        attributes = self._attribute_lists[startup._obj.lpAttributeList]
        listed = tuple(attributes.get(c.PROC_THREAD_ATTRIBUTE_JOB_LIST, ()))
        kept = list(self.owner_jobs)
        while kept and kept[0].silent_breakaway:  # broken away from, upwards
            kept.pop(0)
        nests = bool(kept)  # the listed Jobs must then nest inside what is kept
        if self.image_denied or nests and (any(self._ui(job) for job in listed)
                                           or any(o.ui_restrictions for o in kept)):
            raise win32_error(5, "CreateProcessW")  # ERROR_ACCESS_DENIED
        jobs = (*listed, *kept)
        for job in listed:
            self.jobs[job]["active"] += 1
        self.created.append(jobs)
        self.desktops.append(startup._obj.StartupInfo.lpDesktop)  # (NULL: the starter's)
        pid = 4000 + 4 * len(self.created)
        info._obj.hProcess, info._obj.hThread, info._obj.dwProcessId = pid + 1, pid + 2, pid
        info._obj.dwThreadId = pid + 3
        return 1

    def _ui(self, job: int) -> int:
        data = self.jobs[job]["set"].get(c.JOB_OBJECT_BASIC_UI_RESTRICTIONS)
        return JOBOBJECT_BASIC_UI_RESTRICTIONS.from_buffer_copy(data).UIRestrictionsClass \
            if data else 0


    # window stations and desktops
    def _allows(self, aces: tuple[Ace, ...], wanted: int) -> bool:
        return wanted & ~functools.reduce(
            operator.or_, (acl.allowed(aces, sid) for sid in self.token_sids), 0) == 0

    def OpenWindowStationW(self, name, inherit, access):  # noqa: N802
        if name not in self.stations:
            raise win32_error(c.ERROR_FILE_NOT_FOUND, "OpenWindowStationW")
        if not self._allows(self.stations[name], access):
            raise win32_error(c.ERROR_ACCESS_DENIED, "OpenWindowStationW")
        handle = 0x900 + 4 * len(self._open_stations)
        self._open_stations[handle] = name
        return handle

    def CloseWindowStation(self, handle):  # noqa: N802
        del self._open_stations[handle]
        return 1

    def ConvertStringSecurityDescriptorToSecurityDescriptorW(self, sddl, revision, ref,  # noqa
                                                             size):
        return 1

    def CreateDesktopExW(self, name, device, mode, flags, access, attributes, heap,  # noqa
                         reserved):
        if not self._allows(self.stations[self.station], WINSTA_CREATEDESKTOP):
            raise win32_error(c.ERROR_ACCESS_DENIED, "CreateDesktopExW")
        return 0xA00


def session_station(logon_sid: str) -> tuple[Ace, ...]:
    """A window station's DACL as Windows makes it for a logon session: everything to the
    session's logon SID and to SYSTEM, nothing to anyone else."""
    return (Ace.allow(logon_sid, WINSTA_ALL | c.READ_CONTROL | c.WRITE_DAC | c.DELETE),
            Ace.allow(sids.SYSTEM, WINSTA_ALL | c.READ_CONTROL | c.WRITE_DAC | c.DELETE))


@dataclass(frozen=True)
class OwnerJob:
    """A Job this process is in, as far as starting a child goes: its UI restrictions, and
    whether a child this process creates silently leaves it (SILENT_BREAKAWAY_OK)."""

    ui_restrictions: int = 0
    silent_breakaway: bool = False

    def settings(self, info_class: int) -> bytes:
        """What QueryInformationJobObject answers about it, for `info_class`."""
        if info_class == c.JOB_OBJECT_BASIC_UI_RESTRICTIONS:
            return bytes(JOBOBJECT_BASIC_UI_RESTRICTIONS(self.ui_restrictions))
        info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
        info.BasicLimitInformation.LimitFlags = c.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | (
            c.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK if self.silent_breakaway else 0)
        return bytes(info)


# The Jobs an owner is found in. py.exe, a venv's python.exe (the venv launcher) and the
# console-script .exe pip writes each start the real interpreter in a Job of their own that
# kills on close and lets the interpreter's children break away silently. runas
# (CreateProcessWithLogonW) and Task Scheduler put what they start in a Job that lets nothing
# break away and sets no UI limits. A Job may also set UI limits itself (a kiosk or a build
# agent that does).
LAUNCHER_JOB = OwnerJob(silent_breakaway=True)
PLAIN_JOB = OwnerJob()
UI_LIMITED_JOB = OwnerJob(ui_restrictions=c.JOB_OBJECT_UILIMIT_ALL)


def win32_error(code: int, name: str) -> OSError:
    error = OSError(None, f"{name}: Win32 error {code}")
    error.winerror = code
    return error


def bind_win32(monkeypatch, fake: FakeWin32, *modules) -> None:
    """Make `modules` call `fake` where they call `win32()`."""
    for module in modules:
        monkeypatch.setattr(module, "win32", lambda: fake)
