"""WINREAD 7: a revert's propagation and the reparse points the sandbox made during the run.

Writing a directory's DACL makes Windows impose the inheritance model on everything below it
("Automatic Propagation of Inheritable ACEs"), by name. A sandboxed process may make a junction in
its write root to any folder it can write (Windows 10 1511 and later refuse a sandboxed process a
junction to a folder it cannot write): another write root, say. Had the revert's propagation
followed it, that folder and everything below it would get their inherited entries from the
junction's place, not from their own parent: here, a private folder below the user's profile
would get the Authenticated Users' modify entry the drive's root passes to C:\\data. The model
(test_windows_fakes.FakeTree.write_node) follows such a junction, the worse of what Windows may
do, since Microsoft does not say."""

from __future__ import annotations

import pytest
from test_windows_aceplan import prepare, request
from test_windows_fakes import USER, FakeTree

from stockade.launch.request import PathGrant
from stockade.windows import constants as c
from stockade.windows import grants

AUTHENTICATED_USERS = "S-1-5-11"
WS, PRIVATE = "C:\\data\\ws", "C:\\Users\\u\\private"
JUNCTION = WS + "\\j"


def volume() -> FakeTree:
    """Windows 11's volume with C:\\data\\ws, a folder the user made below the drive's root
    (which gives Authenticated Users modify there), and C:\\Users\\u\\private, the user's own."""
    tree = FakeTree.stock("windows11")
    for path in ("C:\\data", WS, PRIVATE):
        tree.add(path, owner=USER)
    tree.file(WS + "\\out.txt", owner=USER)
    tree.file(PRIVATE + "\\notes", owner=USER)
    tree.add("C:\\py", owner=USER)
    tree.file("C:\\py\\python.exe", owner=USER)
    return tree


def launch(tree: FakeTree):
    """Both folders write roots of one launch; during the run, its child makes a junction in
    the workspace to the private folder (which it can write: a write root)."""
    recorder = prepare(tree, request(
        write=(PathGrant(WS, WS), PathGrant(PRIVATE, PRIVATE)), deny=(), cwd=WS))
    tree.add(JUNCTION, reparse_tag=c.IO_REPARSE_TAG_MOUNT_POINT, target=PRIVATE, owner=USER)
    return recorder


def test_reverting_does_not_propagate_through_a_junction_made_during_the_run():
    tree = volume()
    assert not tree.access(PRIVATE + "\\notes", AUTHENTICATED_USERS)
    before = {key: tree.read(node.path) for key, node in tree.nodes.items()}
    launch(tree).revert_all()
    # Every DACL is as before the launch; the private folder's files gained nothing (before:
    # Authenticated Users could modify them, inherited through the junction from C:\data).
    assert {key: tree.read(tree.nodes[key].path) for key in before} == before
    assert not tree.access(PRIVATE + "\\notes", AUTHENTICATED_USERS)
    # ... and what the child made is as it made it: the junction, to the same folder.
    junction = tree.node(JUNCTION)
    assert (junction.reparse_tag, junction.target) == (c.IO_REPARSE_TAG_MOUNT_POINT, PRIVATE)


def test_a_junction_that_cannot_be_set_aside_refuses_the_revert_and_changes_nothing():
    """FSCTL_DELETE_REPARSE_POINT needs write access to the junction: the child may have made
    one the user cannot write (its own DACL, protected). Then the revert is refused — its record
    kept for reconciling to try again — and nothing propagates through the junction."""
    tree = volume()
    recorder = launch(tree)
    tree.node(JUNCTION).protected = True  # (no entries: only its owner's implicit rights)
    during = {key: tree.read(node.path) for key, node in tree.nodes.items()}
    (detail,) = [detail for _, name, detail in recorder.added if name == WS]
    with pytest.raises(PermissionError):
        grants.revert(WS, detail, tree)
    assert {key: tree.read(node.path) for key, node in tree.nodes.items()} == during
    assert tree.node(JUNCTION).target == PRIVATE
