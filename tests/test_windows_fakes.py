"""A model of an NTFS volume for the Windows backend's pure logic: a tree of files and
directories, each with explicit ACEs, a protected flag, a file id, a link count and reparse
attributes. Reading a DACL gives the explicit entries followed by the inherited ones, derived from
the parent as Windows propagates them (acl.inherit) unless the DACL is protected — which is what
SetNamedSecurityInfoW leaves on disk after propagating a change. It serves as grants.AclStore and
filesystem.Filesystem; `PersistentTree` keeps itself in a JSON file so a crashed process's
changes survive it.

Also here: SIDs used across the tests, and `windows_kinds`, the Windows ledger kinds with
removers bound to a model volume, registered with the ledger as removers.py does on Windows.
"""

from __future__ import annotations

import json
import ntpath
import os
from dataclasses import dataclass, field

from stockade.lifecycle import removers
from stockade.windows import acl, grants, records
from stockade.windows import constants as c
from stockade.windows.acl import Ace, Dacl
from stockade.windows.admission import Entry

PACKAGE = "S-1-15-2-2067022373-1386325468-3431155434-2426632640-3089004462-2553425549-105248742"
OTHER_PACKAGE = "S-1-15-2-9-8-7-6-5-4-3"
USER = "S-1-5-21-1004336348-1177238915-682003330-1001"
ADMINS = "S-1-5-32-544"
USERS = "S-1-5-32-545"
SYSTEM = "S-1-5-18"
FULL = 0x1F01FF
BOTH = acl.OBJECT_INHERIT | acl.CONTAINER_INHERIT


@dataclass
class Node:
    path: str
    is_dir: bool
    explicit: tuple[Ace, ...] = ()
    protected: bool = False
    file_id: str = ""
    links: int = 1
    reparse_tag: int = 0


@dataclass
class FakeTree:
    nodes: dict[str, Node] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)

    @classmethod
    def volume(cls) -> FakeTree:
        """A drive root with a typical system DACL."""
        tree = cls()
        tree.add("C:\\", explicit=(Ace.allow(SYSTEM, FULL, BOTH), Ace.allow(ADMINS, FULL, BOTH),
                                   Ace.allow(USERS, c.FILE_GENERIC_READ_EXECUTE, BOTH)))
        return tree

    def add(self, path: str, *, is_dir: bool = True, explicit: tuple[Ace, ...] = (),
            protected: bool = False, links: int = 1, reparse_tag: int = 0) -> str:
        parent = ntpath.dirname(path)
        assert path == "C:\\" or parent.casefold() in self.nodes, f"no parent for {path}"
        self.nodes[path.casefold()] = Node(path, is_dir, tuple(explicit), protected,
                                           f"1:{len(self.nodes) + 1:x}", links, reparse_tag)
        return path

    def file(self, path: str, **changes) -> str:
        return self.add(path, is_dir=False, **changes)

    def _node(self, path: str) -> Node:
        try:
            return self.nodes[path.casefold()]
        except KeyError:
            raise FileNotFoundError(path) from None

    # grants.AclStore
    def read(self, path: str) -> Dacl:
        node = self._node(path)
        return Dacl(node.explicit + self._inherited(node), node.protected)

    def _inherited(self, node: Node) -> tuple[Ace, ...]:
        if node.protected or node.path == "C:\\":
            return ()
        parent = self.read(ntpath.dirname(node.path))
        return acl.inherit(parent.aces, node.is_dir)

    def write(self, path: str, explicit: tuple[Ace, ...], protected: bool) -> None:
        assert not any(a.inherited for a in explicit), "only explicit entries are written"
        node = self._node(path)
        node.explicit, node.protected = tuple(explicit), protected
        self.writes.append(path)

    def identity(self, path: str) -> str:
        return self._node(path).file_id

    # filesystem.Filesystem
    def entry(self, path: str) -> Entry:
        node = self._node(path)
        attributes = (0x10 if node.is_dir else 0) | (  # FILE_ATTRIBUTE_DIRECTORY
            c.FILE_ATTRIBUTE_REPARSE_POINT if node.reparse_tag else 0)
        return Entry(node.path, node.is_dir, attributes, node.reparse_tag, node.links)

    def scan(self, directory: str) -> list[Entry]:
        prefix = directory.casefold().rstrip("\\") + "\\"
        children = [n.path for key, n in self.nodes.items()
                    if key.startswith(prefix) and "\\" not in key[len(prefix):]]
        return [self.entry(path) for path in sorted(children)]

    def filesystem(self, path: str) -> str:
        return "NTFS"

    # for the tests
    def access(self, path: str, sid: str) -> int:
        return acl.allowed(self.read(path).aces, sid)

    def snapshot(self) -> dict[str, tuple[tuple[str, ...], bool]]:
        return {key: (tuple(a.hex() for a in n.explicit), n.protected)
                for key, n in self.nodes.items()}

    def to_json(self) -> str:
        return json.dumps([[n.path, n.is_dir, [a.hex() for a in n.explicit], n.protected,
                            n.file_id, n.links, n.reparse_tag] for n in self.nodes.values()])

    @classmethod
    def from_json(cls, text: str) -> FakeTree:
        tree = cls()
        for path, is_dir, explicit, protected, file_id, links, tag in json.loads(text):
            tree.nodes[path.casefold()] = Node(path, is_dir,
                                               tuple(Ace.from_hex(h) for h in explicit),
                                               protected, file_id, links, tag)
        return tree


class PersistentTree(FakeTree):
    """A FakeTree saved to `path` after every write; with `crash_after`, the process exits
    (no cleanup at all) instead of making write number `crash_after + 1`."""

    def __init__(self, path: str, crash_after: int | None = None) -> None:
        with open(path) as f:
            super().__init__(nodes=FakeTree.from_json(f.read()).nodes)
        self.path = path
        self.crash_after = crash_after

    def write(self, path: str, explicit: tuple[Ace, ...], protected: bool) -> None:
        if self.crash_after is not None and len(self.writes) >= self.crash_after:
            os._exit(17)
        super().write(path, explicit, protected)
        with open(self.path, "w") as f:
            f.write(self.to_json())


def windows_kinds(store, deleted: list[str]) -> dict:
    """The Windows ledger kinds, their removers bound to `store` (profiles are "deleted" by
    being listed in `deleted`)."""
    return {records.PROFILE_KIND: (records.validate_profile, lambda name, d: deleted.append(name)),
            grants.KIND: (records.validate_acl,
                          lambda name, detail: grants.revert(name, detail, store))}


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


def test_scan_lists_direct_children_only_and_entries_carry_links_and_reparse_tags():
    tree = FakeTree.volume()
    tree.add("C:\\a")
    tree.file("C:\\a\\f", links=2)
    tree.add("C:\\a\\j", reparse_tag=0xA0000003)
    tree.file("C:\\a\\j\\deep")
    assert [e.name for e in tree.scan("C:\\a")] == ["f", "j"]
    assert tree.entry("C:\\a\\f").links == 2
    assert tree.entry("C:\\a\\j").attributes & c.FILE_ATTRIBUTE_REPARSE_POINT
