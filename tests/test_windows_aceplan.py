"""The ACE plan applied to a model NTFS volume: which rights the launch's AppContainer ends up
with on every path, that no other trustee's access moves, and that reverting the ledger's records
(newest first) gives back every DACL exactly."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import windows_dacls
from test_windows_fakes import BOTH, ELEVATED, FULL, PACKAGE, SYSTEM, USER, USERS, FakeTree

from stockade.errors import SetupError, UnavailableError, UnenforceableError
from stockade.launch.request import LaunchRequest, PathGrant
from stockade.windows import aceplan, acl, admission, filesystem, grants
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace

RX = c.FILE_GENERIC_READ_EXECUTE
M = c.FILE_MODIFY
R = RX & ~c.FILE_EXECUTE  # read without execute: 0x120089
DELETE = c.DELETE


class Recorder:
    """A ledger record's `add`, kept in memory, with the store's state at each add."""

    def __init__(self, store: FakeTree) -> None:
        self.store = store
        self.added: list[tuple[str, str, dict]] = []

    def add(self, kind: str, name: str, detail: dict | None = None) -> None:
        self.added.append((kind, name, dict(detail or {})))

    def revert_all(self) -> None:
        for _, name, detail in reversed(self.added):
            grants.revert(name, detail, self.store)


def no_lock(path: str):
    return contextlib.nullcontext()


def walked(tree: FakeTree) -> dict[str, str]:
    """The file ids a walk of the whole tree would have seen, by path."""
    return {node.path: node.file_id for node in tree.nodes.values()}


def workspace(edition: str = "windows11") -> FakeTree:
    """A stock `edition`'s volume (C:\\Windows and C:\\Program Files open to every
    AppContainer, as their split entries say) where C:\\Users\\u\\ws is the workspace (the
    user's own, full control for the user), with a repository, a nested repository, a secret
    and a source tree; and C:\\py a private interpreter."""
    tree = FakeTree.stock(edition)
    for path in ("ws", "ws\\.git", "ws\\.git\\hooks", "ws\\sub", "ws\\sub\\deep",
                 "ws\\sub\\deep\\.GIT", "ws\\src", "ws\\secret", "ws\\vendor", "outside"):
        tree.add("C:\\Users\\u\\" + path, owner=USER)
    for path in ("ws\\README", "ws\\.git\\config", "ws\\.git\\hooks\\pre-commit",
                 "ws\\sub\\deep\\.GIT\\HEAD", "ws\\src\\main.c", "ws\\secret\\key",
                 "ws\\vendor\\lib.dll", "outside\\notes"):
        tree.file("C:\\Users\\u\\" + path, owner=USER)
    # Explicit entries of the user's own, in a non-canonical order, on one file.
    tree.node("C:\\Users\\u\\ws\\README").explicit = (
        Ace.allow(USERS, RX), Ace(acl.DENY, 0, Ace.allow(USERS, 0x2).body))
    tree.add("C:\\py", owner=USER)  # (installed by the user, for the user)
    tree.file("C:\\py\\python.exe", owner=USER)
    return tree


def request(**changes) -> LaunchRequest:
    base = LaunchRequest(
        argv=("C:\\py\\python.exe",), cwd="C:\\Users\\u\\ws", env=(),
        read=(PathGrant("C:\\Windows", "C:\\Windows"), PathGrant("C:\\py", "C:\\py")),
        write=(PathGrant("C:\\Users\\u\\ws", "C:\\Users\\u\\ws"),),
        deny=(PathGrant("C:\\Users\\u\\ws\\secret", "C:\\Users\\u\\ws\\secret"),),
        protected=(".git", ".agents"))
    return replace(base, **changes)


def prepare(tree: FakeTree, req: LaunchRequest, held: list | None = None) -> Recorder:
    recorder = Recorder(tree)
    filesystem.prepare(req, PACKAGE, recorder, tree, tree, no_lock,
                       (held if held is not None else []).append)
    return recorder


def test_the_launch_gets_exactly_its_roots_and_nothing_else():
    tree = workspace()
    prepare(tree, request())
    ws = "C:\\Users\\u\\ws\\"
    expected = {
        "C:\\Users\\u\\ws": M, ws + "README": M & ~c.FILE_EXECUTE, ws + "src": M,
        ws + "src\\main.c": M & ~c.FILE_EXECUTE,
        ws + ".git": RX, ws + ".git\\config": R, ws + ".git\\hooks\\pre-commit": R,
        ws + "sub": M & ~DELETE, ws + "sub\\deep": M & ~DELETE,
        ws + "sub\\deep\\.GIT": RX, ws + "sub\\deep\\.GIT\\HEAD": R,
        ws + "secret": 0, ws + "secret\\key": 0,
        "C:\\py": RX, "C:\\py\\python.exe": RX,
        "C:\\Windows\\System32\\cmd.exe": 0, "C:\\Users\\u\\outside\\notes": 0, "C:\\Users\\u": 0,
    }
    assert {path: tree.access(path, PACKAGE) for path in expected} == expected


def test_what_the_child_creates_later_inherits_the_same_rights():
    tree = workspace()
    prepare(tree, request())
    tree.add("C:\\Users\\u\\ws\\src\\new")
    tree.file("C:\\Users\\u\\ws\\src\\new\\built.exe")
    tree.file("C:\\Users\\u\\ws\\.git\\hooks\\planted")
    assert tree.access("C:\\Users\\u\\ws\\src\\new", PACKAGE) == M
    assert tree.access("C:\\Users\\u\\ws\\src\\new\\built.exe", PACKAGE) == M & ~c.FILE_EXECUTE
    assert tree.access("C:\\Users\\u\\ws\\.git\\hooks\\planted", PACKAGE) == R


def test_exec_from_write_keeps_execute_on_files_but_not_on_protected_names():
    tree = workspace()
    prepare(tree, request(exec_from_write=True))
    assert tree.access("C:\\Users\\u\\ws\\src\\main.c", PACKAGE) == M
    assert tree.access("C:\\Users\\u\\ws\\.git\\config", PACKAGE) == RX


def test_no_other_trustee_gains_or_loses_anything():
    tree = workspace()
    trustees = (USER, USERS, SYSTEM, sids.ALL_APP_PACKAGES)
    before = {(p, t): tree.access(p, t) for p in [n.path for n in tree.nodes.values()]
              for t in trustees}
    prepare(tree, request())
    assert {key: tree.access(*key) for key in before} == before


def test_reverting_newest_first_restores_every_dacl_byte_for_byte():
    tree = workspace()
    original = tree.snapshot()
    recorder = prepare(tree, request())
    assert tree.snapshot() != original
    recorder.revert_all()
    assert tree.snapshot() == original
    recorder.revert_all()  # idempotent
    assert tree.snapshot() == original


def test_every_record_is_added_before_its_path_is_written():
    tree = workspace()
    seen: list[str] = []
    recorder = Recorder(tree)
    original_add, original_write = recorder.add, tree.write_node

    def add(kind, name, detail=None):
        seen.append("add " + name)
        original_add(kind, name, detail)

    def write_node(node, explicit, protected):
        assert seen[-1] == "add " + node.path
        seen.append("write " + node.path)
        original_write(node, explicit, protected)

    recorder.add, tree.write_node = add, write_node
    filesystem.prepare(request(), PACKAGE, recorder, tree, tree, no_lock, lambda p: None)
    assert len(seen) == 2 * len(recorder.added) > 0


def test_records_carry_the_prior_entries_and_the_file_they_were_on():
    tree = workspace()
    readme = tree.read("C:\\Users\\u\\ws\\README")
    recorder = prepare(tree, request(write=(PathGrant("C:\\Users\\u\\ws\\README",
                                                      "C:\\Users\\u\\ws\\README"),),
                                     cwd="C:\\py", deny=(), protected=()))
    (kind, name, detail), = [r for r in recorder.added if r[1].endswith("README")]
    assert (kind, detail["mode"], detail["sid"]) == (grants.KIND, aceplan.GRANT, PACKAGE)
    assert detail["prior"] == [a.hex() for a in readme.explicit]
    assert detail["file_id"] == tree.identity(name) and detail["protected"] is False


def test_grant_revert_keeps_changes_others_made_meanwhile_and_puts_back_the_sids_own_entries():
    tree = workspace()
    path = "C:\\Users\\u\\ws\\src\\main.c"
    own = Ace.allow(PACKAGE, 0x1)
    tree.node(path).explicit = (Ace.allow(USERS, RX), own, Ace.allow(SYSTEM, 4))
    step = aceplan.Step(path, aceplan.GRANT, (Ace.allow(PACKAGE, M),))
    recorder = Recorder(tree)
    grants.apply([step], PACKAGE, tree, recorder, no_lock, walked(tree))
    assert tree.read(path).explicit == (Ace.allow(USERS, RX), Ace.allow(SYSTEM, 4),
                                        Ace.allow(PACKAGE, M))
    meanwhile = Ace.allow(USER, 0x10)
    tree.node(path).explicit += (meanwhile,)
    recorder.revert_all()
    assert tree.read(path).explicit == (Ace.allow(USERS, RX), own, Ace.allow(SYSTEM, 4),
                                        meanwhile)


def test_an_override_keeps_every_other_trustee_in_the_same_evaluation_order():
    tree = workspace()
    path = "C:\\Users\\u\\ws\\src"
    tree.node("C:\\Users\\u\\ws").explicit = (Ace(acl.DENY, BOTH, Ace.allow(USERS, 2).body),
                                               Ace.allow(USERS, RX, BOTH))
    tree.node(path).explicit = (Ace.allow(USER, FULL, BOTH),)
    before = tree.read(path)
    grants.apply([aceplan.Step(path, aceplan.OVERRIDE, ())], PACKAGE, tree, Recorder(tree),
                 no_lock, walked(tree))
    after = tree.read(path)
    assert after.protected and not any(a.inherited for a in after.aces)
    assert [(a.type, a.sid, a.mask) for a in after.aces] == \
        [(a.type, a.sid, a.mask) for a in before.aces]


def test_a_root_replaced_after_the_walk_is_refused_and_the_replacement_left_alone():
    """Issue 31, D11: the DACL was read, the file id taken and the grant written each by name,
    so a directory renamed into a root's place after the walk (by anyone who may write its
    parent) received the grant. Now the grant goes through one handle, to the file the walk
    admitted or to none."""
    tree = workspace()
    ws = "C:\\Users\\u\\ws"
    intruder = tree.node("C:\\Users\\u\\outside")
    before = intruder.explicit
    swapped: list[str] = []

    def rename_over(path: str):  # (taken just before each step: after the walk)
        if path == ws and not swapped:
            swapped.append(path)
            tree.nodes[tree.key(ws)] = tree.nodes.pop(tree.key(intruder.path))
            intruder.path = "C:\\Users\\u\\ws"
        return contextlib.nullcontext()

    recorder = Recorder(tree)
    with pytest.raises(SetupError) as refused:
        filesystem.prepare(request(), PACKAGE, recorder, tree, tree, rename_over,
                           lambda path: None)
    assert refused.value.code == "path_replaced" and swapped
    assert intruder.explicit == before and not tree.access(intruder.path, PACKAGE)
    assert ws not in [name for _, name, _ in recorder.added]


def test_revert_refuses_when_the_path_now_names_another_file():
    tree = workspace()
    recorder = prepare(tree, request())
    tree.node("C:\\Users\\u\\ws\\.git").file_id = "1:ffff"  # replaced meanwhile
    with pytest.raises(grants.RemovalError):
        recorder.revert_all()


def test_revert_of_a_path_that_is_gone_is_done():
    tree = workspace()
    recorder = prepare(tree, request(deny=()))
    gone = tree.key("C:\\Users\\u\\ws\\.git")
    for node in [k for k in tree.nodes if k.startswith(gone)]:
        del tree.nodes[node]
    recorder.revert_all()
    assert tree.access("C:\\Users\\u\\ws\\src\\main.c", PACKAGE) == 0


def test_roots_open_to_every_appcontainer_are_not_touched_or_walked():
    tree = workspace()
    tree.add("C:\\Windows\\junction", reparse_tag=0xA0000003)  # would refuse if walked
    recorder = prepare(tree, request())
    assert not any(name.startswith("C:\\Windows") for _, name, _ in recorder.added)


def test_overridden_paths_are_held_for_the_launch_and_counted():
    tree = workspace()
    held: list[str] = []
    recorder = Recorder(tree)
    done = filesystem.prepare(request(), PACKAGE, recorder, tree, tree, no_lock, held.append)
    ws = "C:\\Users\\u\\ws\\"
    assert sorted(held) == sorted([ws + ".git", ws + "secret", ws + "sub", ws + "sub\\deep",
                                   ws + "sub\\deep\\.GIT"])
    assert done.counts == {"grants": 2, "overrides": 5, "roots_open_to_every_appcontainer": 1,
                           "runtime_roots": 0}


def test_a_read_root_inside_a_write_root_is_read_only():
    tree = workspace()
    prepare(tree, request(read=request().read + (PathGrant("C:\\Users\\u\\ws\\vendor",
                                                           "C:\\Users\\u\\ws\\vendor"),)))
    assert tree.access("C:\\Users\\u\\ws\\vendor\\lib.dll", PACKAGE) == RX
    assert tree.access("C:\\Users\\u\\ws\\vendor", PACKAGE) == RX


def test_nested_write_roots_are_pinned_between_the_outermost_and_a_protected_name():
    tree = workspace()
    inner = PathGrant("C:\\Users\\u\\ws\\sub", "C:\\Users\\u\\ws\\sub")
    prepare(tree, request(write=request().write + (inner,)))
    assert tree.access("C:\\Users\\u\\ws\\sub", PACKAGE) == M & ~DELETE
    assert tree.access("C:\\Users\\u\\ws\\sub\\deep\\.GIT\\HEAD", PACKAGE) == R


def test_a_single_file_root_gets_file_rights_without_inheritance_flags():
    tree = workspace()
    req = request(read=(PathGrant("C:\\py\\python.exe", "C:\\py\\python.exe"),), write=(),
                  deny=(), cwd="C:\\py\\python.exe")
    recorder = prepare(tree, req)
    (_, _, detail), = recorder.added
    assert tree.read("C:\\py\\python.exe").explicit == (Ace.allow(PACKAGE, RX),)
    assert tree.access("C:\\py", PACKAGE) == 0 and detail["mode"] == aceplan.GRANT


@pytest.mark.parametrize(("setup", "capability"), [
    (lambda t: t.add("C:\\Users\\u\\ws\\src\\link", reparse_tag=0xA000000C),
     "filesystem.reparse_point"),
    (lambda t: t.add("C:\\py\\mount", reparse_tag=0xA0000003), "filesystem.reparse_point"),
    (lambda t: t.file("C:\\Users\\u\\ws\\src\\linked", links=2), "filesystem.hard_link"),
    (lambda t: t.file("C:\\py\\python3.12.exe", reparse_tag=c.IO_REPARSE_TAG_APPEXECLINK),
     "filesystem.reparse_point"),
])
def test_reparse_points_and_hard_links_refuse_before_any_dacl_changes(setup, capability):
    tree = workspace()
    setup(tree)
    original = tree.snapshot()
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, request())
    assert refused.value.capability == capability
    assert tree.snapshot() == original and not tree.writes


def test_a_workspace_in_onedrive_is_granted_like_any_other():
    # OneDrive's Files On-Demand makes every file and folder below it a cloud placeholder
    # (IO_REPARSE_TAG_CLOUD_n); they are the files themselves, so the launch goes ahead.
    tree = workspace()
    for key, node in tree.nodes.items():
        if key.startswith(tree.key("C:\\Users\\u\\ws")):
            node.reparse_tag = c.IO_REPARSE_TAG_CLOUD | 0x1000
    recorder = prepare(tree, request())
    assert tree.access("C:\\Users\\u\\ws\\src\\main.c", PACKAGE) == M & ~c.FILE_EXECUTE
    assert tree.access("C:\\Users\\u\\ws\\secret\\key", PACKAGE) == 0
    recorder.revert_all()
    assert all(tree.access(path, PACKAGE) == 0 for path in tree.nodes)


def test_a_denied_path_open_to_every_appcontainer_is_refused():
    tree = workspace()
    tree.file("C:\\Windows\\secret.ini")
    req = request(deny=(PathGrant("C:\\Windows\\secret.ini", "C:\\Windows\\secret.ini"),))
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, req)
    assert refused.value.capability == "filesystem.deny" and not tree.writes


def test_other_filesystems_are_refused_before_anything_else():
    tree = workspace()
    tree.filesystem = lambda path: "FAT32" if path.startswith("C:\\py") else "NTFS"
    with pytest.raises(UnavailableError) as refused:
        prepare(tree, request())
    assert refused.value.code == "unsupported_filesystem" and not tree.writes


@pytest.mark.parametrize("edition", windows_dacls.EDITIONS)
def test_the_stock_split_dacl_of_windows_and_program_files_is_covered(edition):
    # (issue 31, D1) ALL APPLICATION PACKAGES: (RX) on the directory, without inheritance, and
    # (OI)(CI)(IO)(GR,GE) for its contents — the real DACL, and what a directory below inherits
    tree = FakeTree.stock(edition)
    for path in ("C:\\Windows", "C:\\Program Files", "C:\\Windows\\System32",
                 "C:\\Program Files\\Python313"):
        assert aceplan.covered(tree.read(path)), path
    for path in ("C:\\", "C:\\Users", "C:\\Users\\u", "C:\\hostedtoolcache\\windows"):
        assert not aceplan.covered(tree.read(path)), path
    protected, sddl = windows_dacls.STOCK[edition]["C:\\Windows"]
    assert aceplan.covered(acl.Dacl(windows_dacls.aces(sddl), protected))


@pytest.mark.parametrize("edition", windows_dacls.EDITIONS)
def test_a_launch_reading_the_stock_system_directories_leaves_them_alone(edition):
    tree = workspace(edition)
    tree.add("C:\\Program Files\\Python313\\junction", reparse_tag=0xA0000003)
    system = (PathGrant("C:\\Windows", "C:\\Windows"),
              PathGrant("C:\\Program Files", "C:\\Program Files"),
              PathGrant("C:\\Program Files\\Python313", "C:\\Program Files\\Python313"))
    held: list[str] = []
    recorder = Recorder(tree)
    done = filesystem.prepare(request(read=system), PACKAGE, recorder, tree, tree, no_lock,
                              held.append)
    assert done.counts["roots_open_to_every_appcontainer"] == 3
    assert not [name for _, name, _ in recorder.added if not name.startswith("C:\\Users")]
    # and every AppContainer can read and run what is there, the launch's included
    for path in ("C:\\Windows\\System32\\cmd.exe", "C:\\Program Files\\Python313\\python.exe"):
        assert tree.access(path, sids.ALL_APP_PACKAGES) & RX == RX


@pytest.mark.parametrize("edition", windows_dacls.EDITIONS)
def test_a_root_whose_dacl_this_user_may_not_change_is_refused_before_anything(edition):
    # (issue 31, D5) the CI runner's interpreter, made by an administrator below C:\, in a
    # standard user's launch: no WRITE_DAC there; refused typed, naming it, nothing changed
    tree = workspace(edition)
    tree.file("C:\\hostedtoolcache\\windows\\python.exe")
    root = PathGrant("C:\\hostedtoolcache\\windows", "C:\\hostedtoolcache\\windows")
    original = tree.snapshot()
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, request(read=request().read + (root,)))
    assert refused.value.capability == "filesystem.read"
    assert "C:\\hostedtoolcache\\windows" in refused.value.message
    assert "WRITE_DAC" in refused.value.message
    assert tree.snapshot() == original and not tree.writes
    # one file below a root the user owns, owned and locked by someone else: refused too
    tree = workspace(edition)
    tree.file("C:\\Users\\u\\ws\\src\\theirs.c")
    tree.node("C:\\Users\\u\\ws\\src\\theirs.c").protected = True
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, request())
    assert refused.value.capability == "filesystem.write" and "theirs.c" in refused.value.message
    assert not tree.writes
    # elevated, the administrator may: the launch goes ahead
    tree = workspace(edition)
    tree.file("C:\\hostedtoolcache\\windows\\python.exe")
    tree.caller = ELEVATED
    prepare(tree, request(read=request().read + (root,)))
    assert tree.access("C:\\hostedtoolcache\\windows\\python.exe", PACKAGE) == RX
    # and once every AppContainer may read it (the workflow's unelevated job does that), no
    # change is needed at all
    tree = workspace(edition)
    tree.file("C:\\hostedtoolcache\\windows\\python.exe")
    opened = tree.node("C:\\hostedtoolcache\\windows")
    opened.explicit = (Ace.allow(sids.ALL_APP_PACKAGES, RX, BOTH),)
    prepare(tree, request(read=request().read + (root,)))
    assert not [p for p in tree.writes if p.startswith("C:\\hostedtoolcache")]


def test_generic_rights_in_an_entry_count_as_the_file_rights_they_stand_for():
    every = sids.ALL_APP_PACKAGES
    generic_rx = c.GENERIC_READ | c.GENERIC_EXECUTE
    assert aceplan.covered(acl.Dacl((Ace.allow(every, generic_rx, BOTH),)))
    assert aceplan.covered(acl.Dacl((Ace.allow(every, c.GENERIC_ALL, BOTH),)))
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, c.GENERIC_READ, BOTH),)))
    # a split pair must cover all three: the directory, its files and its directories
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, RX),)))
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, generic_rx, BOTH | acl.INHERIT_ONLY),)))
    assert not aceplan.covered(acl.Dacl((
        Ace.allow(every, RX), Ace.allow(every, generic_rx, acl.OBJECT_INHERIT | acl.INHERIT_ONLY))))
    assert not aceplan.covered(acl.Dacl((
        Ace.allow(every, RX), Ace.allow(every, generic_rx, BOTH | acl.INHERIT_ONLY
                                        | acl.NO_PROPAGATE))))
    assert aceplan.exposed(acl.Dacl((Ace.allow(every, c.GENERIC_READ),)))


def test_covered_and_exposed_read_all_application_packages_entries():
    every = sids.ALL_APP_PACKAGES
    assert aceplan.covered(acl.Dacl((Ace.allow(every, RX, BOTH),)))
    assert aceplan.covered(acl.Dacl((Ace.allow(every, FULL, BOTH | acl.INHERITED),)))
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, RX, acl.CONTAINER_INHERIT),)))
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, R, BOTH),)))
    assert not aceplan.covered(acl.Dacl((Ace.allow(every, RX, BOTH | acl.NO_PROPAGATE),)))
    assert aceplan.exposed(acl.Dacl((Ace.allow(sids.ALL_RESTRICTED_APP_PACKAGES, 0x1),)))
    assert not aceplan.exposed(acl.Dacl((Ace.allow(every, 0x80),)))  # attributes only
    assert not aceplan.exposed(acl.Dacl((Ace.allow(every, RX, BOTH | acl.INHERIT_ONLY),)))


def test_root_aces_are_the_documented_masks_and_flags():
    assert aceplan.root_aces(PACKAGE, False, False) == (Ace.allow(PACKAGE, 0x1200A9, BOTH),)
    assert aceplan.root_aces(PACKAGE, True, True) == (Ace.allow(PACKAGE, 0x1301BF, BOTH),)
    assert aceplan.root_aces(PACKAGE, True, False) == (
        Ace.allow(PACKAGE, 0x1301BF, acl.CONTAINER_INHERIT),
        Ace.allow(PACKAGE, 0x13019F, acl.OBJECT_INHERIT | acl.INHERIT_ONLY))
    for ace in aceplan.root_aces(PACKAGE, True, False):
        assert not ace.mask & 0x40  # never FILE_DELETE_CHILD
        assert not ace.mask & (0x40000 | 0x80000)  # never WRITE_DAC or WRITE_OWNER


# --- names Windows tells apart (WINREAD finding 4) ---------------------------------------------

def case_sensitive_twins(tree: FakeTree, names: tuple[str, ...], inner: str) -> FakeTree:
    """`tree` with a case-sensitive directory C:\\Users\\u\\ws\\wsl (fsutil file
    setCaseSensitiveInfo; WSL makes its directories so) holding a directory of each of `names`
    (names only case tells apart), each with a file `inner`."""
    tree.add("C:\\Users\\u\\ws\\wsl", owner=USER, case_sensitive=True)
    for name in names:
        tree.add(f"C:\\Users\\u\\ws\\wsl\\{name}", owner=USER)
        tree.file(f"C:\\Users\\u\\ws\\wsl\\{name}\\{inner}", owner=USER)
    return tree


def test_git_and_GIT_in_a_case_sensitive_directory_are_both_made_read_only():
    # A directory made case-sensitive (fsutil file setCaseSensitiveInfo; WSL makes its
    # directories so) holds `.git` and `.GIT` as two entries. The plan keyed paths by casefold,
    # so one override replaced the other: one of them stayed writable.
    tree = case_sensitive_twins(workspace(), (".git", ".GIT"), "config")
    held: list[str] = []
    recorder = prepare(tree, request(), held)
    for name in (".git", ".GIT"):
        assert tree.access(f"C:\\Users\\u\\ws\\wsl\\{name}", PACKAGE) == RX
        assert tree.access(f"C:\\Users\\u\\ws\\wsl\\{name}\\config", PACKAGE) == R
    assert tree.access("C:\\Users\\u\\ws\\wsl", PACKAGE) == M & ~DELETE  # (pinned)
    # both overridden files share one lease (leases.py compares names as Windows does), which
    # the launch takes once: taking it twice, it would wait for itself
    assert sum(p.upper().endswith("\\WSL\\.GIT") for p in held) == 1
    recorder.revert_all()
    assert all(tree.access(path, PACKAGE) == 0 for path in tree.nodes)


def test_a_name_casefold_confuses_with_a_denied_one_keeps_its_own_protection():
    # To NTFS "straße" and "STRASSE" are two names (its upcase table maps each UTF-16 unit to
    # one unit, and "ß" to itself), in any directory; str.casefold makes both "strasse". With
    # STRASSE denied, the plan took straße for a path inside the hidden one and skipped the
    # `.git` below it (left writable), and a protected "straße" lost its read-only override
    # to the deny.
    tree = workspace()
    for name in ("straße", "STRASSE"):
        tree.add(f"C:\\Users\\u\\ws\\{name}", owner=USER)
        tree.add(f"C:\\Users\\u\\ws\\{name}\\.git", owner=USER)
        tree.file(f"C:\\Users\\u\\ws\\{name}\\.git\\config", owner=USER)
    tree.add("C:\\Users\\u\\ws\\src\\straße", owner=USER)
    denied = PathGrant("C:\\Users\\u\\ws\\STRASSE", "C:\\Users\\u\\ws\\STRASSE")
    req = request(deny=(denied,), protected=(".git", "straße"))
    ws = "C:\\Users\\u\\ws\\"
    walks = {root: list(admission.walk(root, tree.scan, tree.entry))
             for root in ("C:\\Users\\u\\ws", "C:\\py")}
    planned = {(s.path, s.mode, bool(s.aces))
               for s in aceplan.plan(req, PACKAGE, walks, frozenset({"C:\\Windows"}))}
    assert {(ws + "STRASSE", aceplan.OVERRIDE, False), (ws + "straße", aceplan.OVERRIDE, True),
            (ws + "src\\straße", aceplan.OVERRIDE, True)} <= planned
    recorder = prepare(tree, req)
    assert tree.access(ws + "STRASSE\\.git\\config", PACKAGE) == 0
    assert tree.access(ws + "straße", PACKAGE) == RX  # a protected name, read-only
    assert tree.access(ws + "straße\\.git\\config", PACKAGE) == R
    assert tree.access(ws + "src\\straße", PACKAGE) == RX
    assert tree.access(ws + "src\\main.c", PACKAGE) == M & ~c.FILE_EXECUTE
    recorder.revert_all()
    assert all(tree.access(path, PACKAGE) == 0 for path in tree.nodes)


def test_a_denied_name_closes_every_entry_windows_could_find_by_it():
    # In a case-sensitive directory `Secret` and `secret` are two entries; the policy's name
    # (compared without regard to case everywhere else on Windows) stands for both.
    tree = case_sensitive_twins(workspace(), ("Secret", "secret"), "key")
    denied = PathGrant("C:\\Users\\u\\ws\\wsl\\Secret", "C:\\Users\\u\\ws\\wsl\\Secret")
    prepare(tree, request(deny=(denied,)))
    for name in ("Secret", "secret"):
        assert tree.access(f"C:\\Users\\u\\ws\\wsl\\{name}\\key", PACKAGE) == 0


def test_a_denied_path_gone_before_the_walk_is_refused_typed():
    # (removed after filesystem.prepare judged it, before the walk reached it)
    tree = workspace()
    denied = PathGrant("C:\\Users\\u\\ws\\gone", "C:\\Users\\u\\ws\\gone")
    walks = {root: list(admission.walk(root, tree.scan, tree.entry))
             for root in ("C:\\Users\\u\\ws", "C:\\py")}
    with pytest.raises(SetupError) as refused:
        aceplan.plan(request(deny=(denied,)), PACKAGE, walks, frozenset({"C:\\Windows"}))
    assert refused.value.code == "path_replaced"


# --- hard links (WINREAD finding 3) ------------------------------------------------------------

def uv_environment(tree: FakeTree) -> str:
    """A uv environment, as uv makes one by default: each installed file a hard link to the
    same file in uv's cache (conda and pnpm link the same way); returns the environment."""
    cache, env = "C:\\Users\\u\\AppData\\Local\\uv", "C:\\Users\\u\\env"
    for path in (cache, cache + "\\six", env, env + "\\Lib"):
        tree.add(path, owner=USER)
    tree.file(cache + "\\six\\six.py", owner=USER, links=2)
    tree.nodes[tree.key(env + "\\Lib\\six.py")] = replace(  # the same file, a second name
        tree.node(cache + "\\six\\six.py"), path=env + "\\Lib\\six.py")
    tree.file(env + "\\python.exe", owner=USER)
    return env


def test_a_uv_environment_is_admitted_as_a_read_root():
    # Every file of it has two names and one descriptor: the read grant reaches the cache's
    # name too (which this model, deriving inherited entries by path, does not show), giving
    # the same bytes the read root already gives, read-only.
    tree = workspace()
    env = uv_environment(tree)
    recorder = prepare(tree, request(read=request().read + (PathGrant(env, env),)))
    assert tree.access(env + "\\Lib\\six.py", PACKAGE) == RX
    assert tree.access(env + "\\python.exe", PACKAGE) == RX
    recorder.revert_all()
    assert all(tree.access(path, PACKAGE) == 0 for path in tree.nodes)


@pytest.mark.parametrize("inside_workspace", [False, True])
def test_a_multiply_linked_file_in_a_write_root_is_refused_with_how_to_make_copies(
        inside_workspace):
    # Written through the workspace's name, the cache's file would change: refused, also when
    # the environment is a read root inside the workspace (walked with the write root).
    tree = workspace()
    env = uv_environment(tree)
    ws = "C:\\Users\\u\\ws"
    if inside_workspace:
        tree.add(ws + "\\.venv", owner=USER)
        tree.nodes[tree.key(ws + "\\.venv\\six.py")] = replace(
            tree.node(env + "\\Lib\\six.py"), path=ws + "\\.venv\\six.py")
        req = request(read=request().read + (PathGrant(ws + "\\.venv", ws + "\\.venv"),))
    else:
        req = request(write=request().write + (PathGrant(env, env),))
    original = tree.snapshot()
    with pytest.raises(UnenforceableError) as refused:
        prepare(tree, req)
    assert refused.value.capability == "filesystem.hard_link"
    assert "UV_LINK_MODE=copy" in refused.value.message and "always_copy" in refused.value.message
    assert "package-import-method copy" in refused.value.message
    assert tree.snapshot() == original and not tree.writes
