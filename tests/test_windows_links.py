"""A denied file reached through a hard link in a read root (review of winB's admission of
multiply linked files in read roots): NTFS keeps one security descriptor per file, shared by
its names, so the inheritable grant on a read root, propagated by name, is written into the
denied file itself through its link there. The launch is refused
(`unenforceable:filesystem.deny`) before any DACL changes, and a standing grant is made only
over a root whose files have no name outside it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_windows_aceplan import RX, no_lock, prepare, request, workspace
from test_windows_fakes import BOTH, PACKAGE, USER, FakeTree
from test_windows_standing import launch

from stockade.errors import UnenforceableError
from stockade.launch.request import PathGrant
from stockade.windows import acl, fsinfo, standing
from stockade.windows.acl import Ace

PROJ, SSH = "C:\\proj", "C:\\Users\\u\\.ssh"
KEY = SSH + "\\id_rsa"


def linked(tree: FakeTree, into: str = PROJ) -> FakeTree:
    """The user's SSH key, and a hard link to it (`k`) in `into`."""
    tree.add(SSH, owner=USER)
    tree.file(KEY, owner=USER)
    if into == PROJ:
        tree.add(PROJ, owner=USER)
    tree.link(KEY, into + "\\k")
    return tree


def reads_proj(denied: str = SSH):
    return request(read=request().read + (PathGrant(PROJ, PROJ),),
                   deny=request().deny + (PathGrant(denied, denied),))


def test_the_fake_keeps_one_descriptor_per_file_for_all_its_names():
    tree = linked(workspace())
    assert tree.names(PROJ + "\\k") == [KEY, PROJ + "\\k"]
    assert tree.entry(PROJ + "\\k").path == PROJ + "\\k" and tree.entry(KEY).links == 2
    tree.write(PROJ, (Ace.allow(PACKAGE, RX, BOTH),), False)
    assert tree.access(KEY, PACKAGE) == RX  # the grant reached the key through `k`


def test_a_read_root_linking_a_denied_file_is_refused_before_any_dacl_changes():
    tree = linked(workspace())
    before = tree.snapshot()
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, reads_proj())
    assert refused.value.code == "unenforceable:filesystem.deny"
    assert PROJ + "\\k" in refused.value.message and KEY in refused.value.message
    assert tree.snapshot() == before and not tree.writes
    assert tree.access(KEY, PACKAGE) == 0


def test_a_denied_file_itself_linked_into_a_read_root_is_refused():
    tree = linked(workspace())
    with pytest.raises(UnenforceableError, match="filesystem.deny"):
        prepare(tree, reads_proj(KEY))


def test_a_link_to_a_file_nothing_denies_is_admitted_in_a_read_root():
    tree = linked(workspace())
    recorder = prepare(tree, request(read=request().read + (PathGrant(PROJ, PROJ),)))
    assert tree.access(PROJ + "\\k", PACKAGE) == RX
    recorder.revert_all()
    assert tree.access(KEY, PACKAGE) == 0


def test_a_runtime_root_linking_outside_itself_gets_no_standing_grant(tmp_path):
    """A standing grant outlives the launch that made it: a later launch denying the key
    would hold the capability the key took through `k`. So such a root is each launch's own
    grant (walked, its links checked against that launch's denied paths, reverted)."""
    grants = standing.StandingGrants(str(tmp_path / "state"))
    tree = linked(workspace(), into="C:\\py")
    first, recorder = launch(tree, grants)
    assert first.capabilities == () and first.counts["runtime_roots"] == 0
    assert tree.access("C:\\py\\python.exe", PACKAGE) == RX  # the launch's own grant
    recorder.revert_all()
    assert tree.access(KEY, PACKAGE) == 0 and grants.revoke_all(tree, no_lock) == ([], [])
    with pytest.raises(UnenforceableError, match="filesystem.deny"):
        launch(tree, grants, request(deny=request().deny + (PathGrant(SSH, SSH),)))
    assert tree.access(KEY, PACKAGE) == 0


def test_a_runtime_root_whose_links_stay_inside_it_keeps_its_standing_grant(tmp_path):
    grants = standing.StandingGrants(str(tmp_path / "state"))
    tree = workspace()
    tree.link("C:\\py\\python.exe", "C:\\py\\python3.exe")
    first, _ = launch(tree, grants)
    assert len(first.capabilities) == 1 and first.counts["runtime_roots"] == 1


def test_fsinfo_lists_every_name_on_the_files_volume(monkeypatch):
    """FindFirstFileNameW / FindNextFileNameW as documented: each name from the volume's root
    without the drive, the list ended by ERROR_HANDLE_EOF (38), the handle closed after."""
    names = ["\\Users\\u\\.ssh\\id_rsa", "\\proj\\k"]
    closed = []

    def first(path, flags, size, buffer):
        assert path == PROJ + "\\k" and flags == 0
        buffer.value = names[0]
        return 7

    def following(handle, size, buffer):
        seen = following.count = getattr(following, "count", 0) + 1
        if seen >= len(names):
            return 0
        buffer.value = names[seen]
        return 1

    def volume(path, buffer, size):
        buffer.value = "C:\\"
        return 1

    monkeypatch.setattr(fsinfo, "win32", lambda: SimpleNamespace(
        GetVolumePathNameW=volume, FindFirstFileNameW=first, FindNextFileNameW=following,
        FindClose=closed.append))
    monkeypatch.setattr(fsinfo, "last_error", lambda: 38)
    assert fsinfo.names(PROJ + "\\k") == [KEY, PROJ + "\\k"] and closed == [7]


CACHE = "C:\\Users\\u\\AppData\\Local\\uv\\cache"
CACHED = CACHE + "\\lib.py"
OTHER = "S-1-5-21-1-2-3-1001"  # a trustee the cache passes on and the project does not


def cached(tree: FakeTree) -> FakeTree:
    """A file of a package manager's cache (uv, conda), hard-linked into the project, as uv
    and conda make environments: the cache passes on an entry the project does not."""
    tree.add("C:\\Users\\u\\AppData\\Local\\uv", owner=USER)
    tree.add(CACHE, owner=USER, explicit=(Ace.allow(OTHER, RX, BOTH),))
    tree.file(CACHED, owner=USER)
    tree.add(PROJ, owner=USER)
    tree.link(CACHED, PROJ + "\\lib.py")
    return tree


def test_a_linked_file_in_a_read_root_is_shielded_from_the_roots_propagation():
    """Issue 31, item 5: a file with a name outside the read root has one security descriptor
    for both names, so the root's grant, propagated by name, rewrote its inherited entries —
    seen at the cache's name during the launch, and after the revert's propagation they were
    the project's, no longer the cache's: a host change outside every root that outlived the
    launch. Now the file is shielded before the root is granted: its DACL protected, what it
    inherited kept as explicit entries, the launch's read entry explicit on it; propagation
    passes it by; the revert puts back its entries and protection, so it inherits from its
    own parent again. The sandbox still reads it (uv and conda environments keep working)."""
    tree = cached(workspace())
    before = tree.read(CACHED)
    recorder = prepare(tree, request(read=request().read + (PathGrant(PROJ, PROJ),)))
    during = tree.read(CACHED)
    assert tree.access(PROJ + "\\lib.py", PACKAGE) == RX
    assert not [a for a in during.aces if a.sid == PACKAGE and a.inherited]
    assert [a for a in during.aces if a.sid == OTHER]  # the cache's trustee keeps its access
    recorder.revert_all()
    assert tree.read(CACHED) == before
    assert tree.access(CACHED, PACKAGE) == 0


def test_a_shielded_file_gets_its_descriptor_back_verbatim_whichever_parent_it_would_take():
    """Issue 31, first contact, item A: the shield's revert unprotected the file's DACL
    (SetSecurityInfo), leaving Windows to derive its inherited entries again — from which of
    its names' parents is not documented. Taken from the name the revert opened it by (the
    root's side: `inherit_by_name`), the cache's name kept the project's entries after the
    launch, and SE_DACL_AUTO_INHERITED was set where it was not. Now the shield's record holds
    the file's whole DACL and control bits, and the revert writes exactly that back."""
    tree = cached(workspace())
    tree.inherit_by_name = True
    tree.node(CACHED).auto_inherited = False  # (its DACL written by SetFileSecurity, once)
    before = acl.self_relative(tree.read(CACHED))
    recorder = prepare(tree, request(read=request().read + (PathGrant(PROJ, PROJ),)))
    assert tree.access(PROJ + "\\lib.py", PACKAGE) == RX
    recorder.revert_all()
    assert acl.self_relative(tree.read(CACHED)) == before
    assert tree.access(CACHED, PACKAGE) == 0 and tree.access(CACHED, OTHER) == RX
    (shield,) = [detail for _, name, detail in recorder.added if detail["mode"] == "shield"]
    assert shield["control"] == 0 and shield["prior"] == [a.hex() for a in tree_aces(before)]


def tree_aces(descriptor: bytes) -> tuple[Ace, ...]:
    """The entries of a self-relative descriptor's DACL (its header is 20 bytes)."""
    return acl.decode(descriptor[20:])


PROGRAM = "C:\\Program Files\\Tool"


@pytest.mark.parametrize("policy_reads", [True, False])
def test_a_denied_file_linked_from_a_folder_every_appcontainer_reads_is_refused(policy_reads):
    """Issue 31, first contact B: a read root every AppContainer can read (C:\\Program Files)
    is not walked (too large to walk at each launch), so a hard link there to a denied file —
    the key's one security descriptor, which takes ALL APPLICATION PACKAGES' read whenever
    Windows propagates that folder — went unnoticed. Now the denied side is looked at: each
    denied file with several names has them listed, and one in such a root, or in any folder
    every AppContainer may read, refuses the launch before any DACL changes, naming both and
    the remedy."""
    tree = workspace()
    tree.add(PROGRAM)
    linked(tree, into=PROGRAM)
    reads = (PathGrant("C:\\Program Files", "C:\\Program Files"),) if policy_reads else ()
    before = tree.snapshot()
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, request(read=request().read + reads,
                              deny=request().deny + (PathGrant(SSH, SSH),)))
    assert refused.value.code == "unenforceable:filesystem.deny"
    assert KEY in refused.value.message and PROGRAM + "\\k" in refused.value.message
    assert "fsutil hardlink list" in refused.value.message
    assert tree.snapshot() == before and not tree.writes


def test_a_denied_files_link_outside_every_root_in_a_private_folder_is_admitted():
    tree = workspace()
    tree.add("C:\\Users\\u\\backup", owner=USER)
    linked(tree, into="C:\\Users\\u\\backup")
    prepare(tree, request(deny=request().deny + (PathGrant(SSH, SSH),)))
    assert tree.access(KEY, PACKAGE) == 0
