"""The Windows backend's ledger records, with the real launch ledger: validation, settlement,
reconciliation after a crash at every point of a launch (in a child process that dies without
cleaning up), and quarantine retiring AppContainer names.

The Windows kinds are registered with removers.register, their removers bound to a model
volume (`install_kinds`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_windows_aceplan import request, workspace
from test_windows_fakes import (
    PACKAGE,
    USER,
    FakeTree,
    PersistentTree,
    install_kinds,
    windows_kinds,
)
from test_windows_links import CACHED, PROJ, cached
from windows_like import run_as_windows

from stockade.errors import SetupError, UnavailableError
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import Ledger
from stockade.windows import acl, filesystem, grants, identity, records
from stockade.windows.acl import Ace

TESTS = os.path.dirname(os.path.abspath(__file__))
PROFILE = "stockade-ac-" + "0123456789abcdef01234567"


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return str(path)


@pytest.fixture
def tree_file(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(workspace().to_json())
    return str(path)


@pytest.fixture
def kinds(tree_file):
    store, deleted = PersistentTree(tree_file), []
    install_kinds(windows_kinds(store, deleted))
    return store, deleted


def good_detail(**changes) -> dict:
    detail = {"sid": PACKAGE, "mode": "grant", "prior": [Ace.allow(USER, 1).hex()],
              "protected": False, "file_id": "1f:2a"}
    return detail | changes


def test_valid_records_are_accepted():
    records.validate_acl("C:\\Users\\u\\ws", good_detail())
    records.validate_acl("D:\\", good_detail(mode="override", prior=[], protected=True))
    records.validate_acl("C:\\ws\\lib.py", good_detail(mode="shield", control=0x400))
    records.validate_acl("C:\\ws\\lib.py", good_detail(mode="shield", control=0x1400,
                                                      protected=True))
    records.validate_profile(PROFILE, {})


@pytest.mark.parametrize(("name", "detail"), [
    ("C:\\Users\\u\\ws", good_detail(sid=USER)),                    # never a user's entries
    ("C:\\Users\\u\\ws", good_detail(sid="S-1-15-2-1")),            # nor every package's
    ("\\\\server\\share\\ws", good_detail()),
    ("C:\\Users\\u\\ws\\..\\x", good_detail()),
    ("/home/u/ws", good_detail()),
    ("C:\\ws", good_detail(mode="deny")),
    ("C:\\ws", good_detail(protected="no")),
    ("C:\\ws", good_detail(file_id="here")),
    ("C:\\ws", good_detail(prior=["zz"])),
    ("C:\\ws", good_detail(prior=[Ace.allow(USER, 1).hex() + "00"])),
    ("C:\\ws", good_detail(prior="00")),
    ("C:\\ws", good_detail(extra=1)),
    ("C:\\ws", good_detail(control=0)),                            # a shield's alone
    ("C:\\ws", good_detail(mode="shield")),                         # without its control
    ("C:\\ws", good_detail(mode="shield", control=0x8004)),         # only DACL control bits
    ("C:\\ws", good_detail(mode="shield", control=0x1000)),         # its protection's
    ("C:\\ws", good_detail(mode="shield", control="0")),
    ("C:\\ws", good_detail(mode="shield", control=True)),
    ("C:\\ws", {k: v for k, v in good_detail().items() if k != "file_id"}),
])
def test_records_a_remover_could_not_act_on_safely_are_refused(name, detail):
    with pytest.raises(ValueError):
        records.validate_acl(name, detail)


@pytest.mark.parametrize(("name", "detail"), [
    ("stockade-ac-0123", {}), ("Stockade-AC-" + "0" * 24, {}), (PROFILE, {"sid": PACKAGE}),
    ("C:\\Users\\u\\AppData\\Local\\Packages\\" + PROFILE, {}),
])
def test_profile_records_name_a_stockade_profile_only(name, detail):
    with pytest.raises(ValueError):
        records.validate_profile(name, detail)


def test_registered_kinds_are_validated_by_their_own_validator_and_built_ins_stay(state, kinds):
    with Ledger(state).launch("request-v") as record, pytest.raises(ValueError):
        record.add(records.PROFILE_KIND, "stockade-ac-0123")
    with pytest.raises(ValueError, match="built-in"):
        removers.register("dir", records.validate_acl, records.remove_acl)
    assert set(records.KINDS) <= set(removers.REMOVERS)


@pytest.mark.parametrize("first", ["grants", "records", "aclstore", "handle", "backend"])
def test_on_windows_any_module_imported_first_registers_the_kinds_without_a_cycle(first):
    # In an interpreter that looks like Windows CPython (tests/windows_like.py: a guard against
    # the import cycle grants -> removers -> records -> grants, not a Windows emulator).
    out = run_as_windows(f"""
        import stockade.windows.{first}
        import stockade.windows.records
        from stockade.lifecycle import removers
        print(" ".join(sorted(removers.REMOVERS)))
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["appcontainer", "brokermanifest", "dir", "process",
                                  "socket", "winacl", "winsta"]


def test_the_ledger_imports_no_backend_and_elsewhere_windows_kinds_are_foreign():
    import ast

    for module in (removers, sys.modules["stockade.lifecycle.ledger"]):
        with open(module.__file__) as f:
            tree = ast.parse(f.read())
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names]
        assert not [name for name in imported if name and name.startswith(
            ("stockade.windows", "stockade.linux", "stockade.vm"))], module.__name__
    code = ("import stockade.windows.backend\nfrom stockade.lifecycle import removers\n"
            "print(sorted(set(removers.REMOVERS) & {'appcontainer', 'winacl', 'winsta', "
            "'brokermanifest'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"  # not on Windows: such a record is quarantined


def test_profile_names_come_from_the_request_id_and_never_repeat_across_ids():
    first = identity.profile_name("a" * 32, set())
    assert identity.PROFILE_NAME.fullmatch(first)
    assert first == identity.profile_name("a" * 32, set())
    assert len({identity.profile_name(f"{i:032x}", set()) for i in range(2000)}) == 2000
    assert len(first) <= 64  # CreateAppContainerProfile's limit


def test_a_settled_launch_leaves_every_dacl_as_it_was_and_deletes_its_profile(state, kinds):
    store, deleted = kinds
    original = store.snapshot()
    with Ledger(state).launch("request-1") as record:
        record.add(records.PROFILE_KIND, PROFILE)
        filesystem.prepare(request(), PACKAGE, record, store, store,
                           lambda p: contextlib.nullcontext(), lambda p: None)
        assert store.snapshot() != original
    assert store.snapshot() == original and deleted == [PROFILE]
    assert Ledger(state).records() == []


CHILD = textwrap.dedent("""
    import contextlib, os, sys
    from stockade.launch.request import PathGrant
    from stockade.lifecycle.ledger import Ledger
    from stockade.windows import filesystem
    from test_windows_aceplan import request
    from test_windows_fakes import PACKAGE, PersistentTree, install_kinds, windows_kinds

    tree_file, state, crash_after, profile, *more = sys.argv[1:]
    store = PersistentTree(tree_file, int(crash_after))
    install_kinds(windows_kinds(store, []))
    with Ledger(state).launch("request-crash") as record:
        record.add("appcontainer", profile)
        req = request(read=request().read + tuple(PathGrant(p, p) for p in more))
        filesystem.prepare(req, PACKAGE, record, store, store,
                           lambda p: contextlib.nullcontext(), lambda p: None)
        os._exit(3)  # the owner dies while its sandbox runs
""")


def crash(tree_file: str, state: str, crash_after: int, *read: str) -> int:
    """The launch of `request()` (reading `read` too) in a child that dies after
    `crash_after` DACL writes (17), or once every one is made (3)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [TESTS, os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", CHILD, tree_file, state, str(crash_after),
                           PROFILE, *read], env=env, timeout=60).returncode


def test_a_crash_at_any_point_of_a_launch_is_reconciled_exactly(state, tree_file):
    with open(tree_file) as f:
        pristine = f.read()
    original = PersistentTree(tree_file).snapshot()
    writes = None
    for crash_after in range(0, 20):
        with open(tree_file, "w") as f:
            f.write(pristine)
        code = crash(tree_file, state, crash_after)
        assert code in (3, 17)
        store, deleted = PersistentTree(tree_file), []
        install_kinds(windows_kinds(store, deleted))
        done = Ledger(state).reconcile()
        assert (done.reconciled, done.failed, done.quarantined) == (1, 0, 0)
        assert store.snapshot() == original, f"residue after a crash after {crash_after} writes"
        assert deleted == [PROFILE] and Ledger(state).records() == []
        if code == 3:  # the launch got through every write before dying
            writes = crash_after
            break
    assert writes and writes >= 7  # grants and overrides alike were crashed in between


def test_a_crash_after_a_shield_is_reconciled_to_the_files_descriptor_verbatim(state, tmp_path):
    """Issue 31, item A: a file hard-linked from its cache into a read root is shielded
    first; the owner dies right after that (1 write) or while the sandbox runs (every write
    made). Reconciling (`stockade reconcile`) writes back the file's whole DACL from the
    record: byte for byte what it was, though the model derives a file's inherited entries
    from the parent of the name its DACL is written by (the root's, for the shield's path)."""
    tree = cached(workspace())
    tree.inherit_by_name = True
    tree.node(CACHED).auto_inherited = False
    pristine = tree.to_json()
    descriptor = acl.self_relative(tree.read(CACHED))
    tree_file = str(tmp_path / "linked.json")
    for crash_after, code in ((1, 17), (1000, 3)):
        with open(tree_file, "w") as f:
            f.write(pristine)
        assert crash(tree_file, state, crash_after, PROJ) == code
        shielded = PersistentTree(tree_file)
        assert shielded.read(CACHED).protected  # (the shield was made)
        store, deleted = PersistentTree(tree_file), []
        install_kinds(windows_kinds(store, deleted))
        done = Ledger(state).reconcile()
        assert (done.reconciled, done.failed, done.quarantined) == (1, 0, 0)
        assert acl.self_relative(PersistentTree(tree_file).read(CACHED)) == descriptor
        assert PersistentTree(tree_file).snapshot() == FakeTree.from_json(pristine).snapshot()


def test_a_tampered_record_is_quarantined_not_obeyed_and_its_names_retired(
        state, tree_file, kinds):
    store, deleted = kinds
    assert crash(tree_file, state, 0) == 17  # a record holding the profile and a first grant
    ledger = Ledger(state)
    (name,) = ledger.records()
    with open(os.path.join(ledger.records_dir, name), "a") as f:  # an entry naming the user
        f.write(json.dumps({"add": {"kind": grants.KIND, "name": "C:\\Users\\u\\ws",
                                    "detail": good_detail(sid=USER)}}) + "\n")
    original = PersistentTree(tree_file).snapshot()
    assert ledger.reconcile().quarantined == 1
    assert PersistentTree(tree_file).snapshot() == original and deleted == []
    assert PROFILE in ledger.retired()
    with pytest.raises(UnavailableError) as refused:
        ledger.check()
    assert refused.value.code == "ledger_corrupt"


def test_a_profile_name_seen_in_a_quarantined_record_is_never_handed_out_again(state, kinds):
    ledger = Ledger(state)
    name = identity.profile_name("request-q", set())
    os.makedirs(ledger.records_dir, mode=0o700)
    with open(os.path.join(ledger.records_dir, "f" * 64 + ".json"), "w") as f:
        f.write(f"not a record, but it names {name}\n")
    assert ledger.reconcile().quarantined == 1
    with pytest.raises(SetupError) as refused:
        identity.profile_name("request-q", ledger.retired())
    assert refused.value.code == "ledger_identity_reused"
    with pytest.raises(SetupError), ledger.launch("request-other") as record:
        record.add(records.PROFILE_KIND, name)
