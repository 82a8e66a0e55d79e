"""Standing grants on runtime roots (issue 31, D10), over a model volume: the interpreter's tree
is walked and granted once, to a capability of its own, and reused by later launches without a
walk; it is ledgered before the DACL changes and taken back whole by `revoke_all`."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from test_windows_aceplan import RX, R, Recorder, no_lock, request, workspace
from test_windows_fakes import BOTH, PACKAGE, USER, FakeTree

from stockade.errors import SetupError
from stockade.launch.request import PathGrant
from stockade.windows import acl, filesystem, standing
from stockade.windows import constants as c
from stockade.windows.acl import Ace

PY = "C:\\py"


def launch(tree: FakeTree, grants: standing.StandingGrants, req=None, package: str = PACKAGE):
    recorder = Recorder(tree)
    done = filesystem.prepare(req or request(), package, recorder, tree, tree, no_lock,
                              lambda path: None, grants, USER)
    return done, recorder


def reach(tree: FakeTree, path: str, package: str, capabilities: tuple[str, ...]) -> int:
    """What a token of `package` holding `capabilities` is allowed on `path` (its package SID's
    and its capabilities' entries, as Windows' AppContainer check sums them)."""
    aces = tree.read(path).aces
    out = acl.allowed(aces, package)
    for capability in capabilities:
        out |= acl.allowed(aces, capability)
    return out


@pytest.fixture
def grants(tmp_path) -> standing.StandingGrants:
    return standing.StandingGrants(str(tmp_path / "state"))


def test_a_runtime_root_is_granted_once_to_a_capability_and_reused_without_a_walk(grants):
    tree = workspace()
    before = tree.snapshot()
    first, recorder = launch(tree, grants)
    (capability,) = first.capabilities
    assert standing.is_capability(capability) and first.counts["runtime_roots"] == 1
    assert reach(tree, PY + "\\python.exe", PACKAGE, first.capabilities) == RX
    assert tree.access(PY + "\\python.exe", PACKAGE) == 0  # not the launch's own grant
    assert PY not in [name for _, name, _ in recorder.added]  # nor in the launch's record
    recorder.revert_all()  # the launch settles: the standing grant stays
    assert tree.access(PY, capability) == RX

    scanned, tree.scan = [], (lambda d, scan=tree.scan: scanned.append(d) or scan(d))
    tree.writes.clear()
    second, recorder = launch(tree, grants, package="S-1-15-2-9-9-9-9-9-9-9")
    assert second.capabilities == (capability,)
    assert not [d for d in scanned if d.startswith(PY)]  # no walk
    assert not [p for p in tree.writes if p.startswith(PY)]  # no grant, and no revert below
    recorder.revert_all()
    assert grants.revoke_all(tree, no_lock) == ([PY], [])
    assert tree.snapshot() == before and not os.listdir(grants.directory)


def test_the_record_is_durable_before_the_dacl_changes(grants):
    tree = workspace()
    written = []

    def write_node(node, explicit, protected, original=tree.write_node):
        if node.path == PY:
            with open(grants._path(PY)) as f:
                written.append(json.load(f))
        original(node, explicit, protected)

    tree.write_node = write_node
    launch(tree, grants)
    (body,) = written
    assert body["path"] == PY and body["detail"]["sid"] == body["capability"]


@pytest.mark.parametrize("change", [
    lambda req: replace(req, deny=req.deny + (PathGrant(PY + "\\lib", PY + "\\lib"),)),
    lambda req: replace(req, write=req.write + (PathGrant(PY + "\\lib", PY + "\\lib"),)),
    lambda req: replace(req, read=req.read + (PathGrant(PY + "\\lib", PY + "\\lib"),)),
])
def test_a_root_with_anything_of_the_request_inside_is_the_launchs_own_grant(grants, change):
    """A deny (or another root) inside it needs an override for this launch alone, which a
    capability other launches hold could not respect."""
    tree = workspace()
    tree.add(PY + "\\lib", owner=USER)
    done, recorder = launch(tree, grants, change(request()))
    assert done.capabilities == () and PY in [name for _, name, _ in recorder.added]
    assert not os.path.exists(grants.directory) or not os.listdir(grants.directory)


def test_a_replaced_root_or_a_reset_dacl_is_granted_anew(grants):
    tree = workspace()
    (first,) = launch(tree, grants)[0].capabilities
    tree.node(PY).explicit = ()  # (icacls /reset, say)
    (again,) = launch(tree, grants)[0].capabilities
    assert again == first and tree.access(PY, first) == RX
    tree.nodes.pop(tree.key(PY))  # (reinstalled: another directory there)
    tree.add(PY, owner=USER)
    tree.node(PY).file_id = "1:fff0"
    (other,) = launch(tree, grants)[0].capabilities
    assert other != first and tree.access(PY, other) == RX and not tree.access(PY, first)
    with open(grants._path(PY)) as f:
        assert json.load(f)["capability"] == other


@pytest.mark.parametrize("tamper", [
    lambda body: body.update(capability=PACKAGE),
    lambda body: body["detail"].update(sid=USER),
    lambda body: body.update(path="relative\\py"),
    lambda body: body["detail"].update(mode="override"),
])
def test_a_tampered_record_is_refused_not_obeyed(grants, tamper):
    tree = workspace()
    launch(tree, grants)
    path = grants._path(PY)
    with open(path) as f:
        body = json.load(f)
    tamper(body)
    with open(path, "w") as f:
        json.dump(body, f)
    during = tree.snapshot()
    done, kept = grants.revoke_all(tree, no_lock)
    assert done == [] and len(kept) == 1 and os.path.exists(path)
    assert tree.snapshot() == during


def test_the_capability_is_of_the_derived_shape_and_names_user_root_and_file():
    one = standing.capability_sid(USER, PY, "1:2")
    assert standing.is_capability(one) and one == standing.capability_sid(USER, "c:\\PY", "1:2")
    assert len({one, standing.capability_sid(USER, PY, "1:3"),
                standing.capability_sid(USER, "C:\\py2", "1:2"),
                standing.capability_sid("S-1-5-21-1-2-3-1002", PY, "1:2")}) == 4
    assert Ace.allow(one, RX).sid == one


def test_stockade_reconcile_takes_every_standing_grant_back(grants, monkeypatch, capsys):
    """How a user removes them: `stockade reconcile --revoke-runtime-grants`."""
    from stockade.cli import main

    tree = workspace()
    before = tree.snapshot()
    launch(tree, grants)[1].revert_all()  # (the launch settled)
    monkeypatch.setenv("STOCKADE_STATE_DIR", grants.root)
    monkeypatch.setattr(standing, "revoke_here", lambda: grants.revoke_all(tree, no_lock))
    assert main(["reconcile", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_grants_revoked"] == []
    assert tree.snapshot() != before
    assert main(["reconcile", "--revoke-runtime-grants", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime_grants_revoked"] == [PY]
    assert tree.snapshot() == before


def stuck(tree: FakeTree, root: str) -> None:
    """A symbolic link made in `root` after its grant (by a launch writing a folder there):
    the revert cannot set it aside (aclstore.py), so it is refused."""
    tree.file(root + "\\link", reparse_tag=c.IO_REPARSE_TAG_SYMLINK, target="C:\\Users\\u")


def test_a_stuck_standing_grant_is_kept_and_the_others_still_taken_back(grants, monkeypatch,
                                                                          capsys):
    from stockade.cli import main

    tree = workspace()
    tree.add("C:\\py2", owner=USER)
    tree.file("C:\\py2\\python.exe", owner=USER)
    req = request(read=request().read + (PathGrant("C:\\py2", "C:\\py2"),))
    launch(tree, grants, req)[1].revert_all()
    stuck(tree, PY)
    done, kept = grants.revoke_all(tree, no_lock)
    assert done == ["C:\\py2"] and len(kept) == 1 and PY + "\\link" in kept[0]
    assert os.path.exists(grants._path(PY)) and not os.path.exists(grants._path("C:\\py2"))
    monkeypatch.setenv("STOCKADE_STATE_DIR", grants.root)
    monkeypatch.setattr(standing, "revoke_here", lambda: grants.revoke_all(tree, no_lock))
    assert main(["reconcile", "--revoke-runtime-grants", "--json"]) == 1
    assert len(json.loads(capsys.readouterr().out)["runtime_grants_kept"]) == 1


def test_a_standing_grant_that_cannot_be_renewed_refuses_the_launch_typed(grants):
    tree = workspace()
    launch(tree, grants)[1].revert_all()
    record = grants.load(PY)
    # Its entry changed (no longer the one planned): taken back and made anew.
    tree.node(PY).explicit = (Ace.allow(record["capability"], R, BOTH),)
    stuck(tree, PY)
    with pytest.raises(SetupError) as refused:
        launch(tree, grants)
    assert refused.value.code == "runtime_grant_stuck" and PY + "\\link" in str(refused.value)
    assert grants.load(PY) == record  # kept, for reconciling


def test_an_access_denied_revert_is_kept_typed(grants):
    tree = workspace()
    launch(tree, grants)[1].revert_all()
    tree.add(PY + "\\j", reparse_tag=c.IO_REPARSE_TAG_MOUNT_POINT, target="C:\\Users\\u",
             protected=True)  # (a junction the user may not write: PermissionError)
    done, kept = grants.revoke_all(tree, no_lock)
    assert done == [] and len(kept) == 1 and os.path.exists(grants._path(PY))
