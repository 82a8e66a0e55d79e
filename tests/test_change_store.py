"""The change-set store is trusted only when it is the user's alone all the way down (issue 29
part 2, issue 30): a real overlaid run made under any umask leaves no directory others can
write, and `apply` refuses, typed, a store or a set that someone else could have written or
that was planted (a `created` in the future, a set whose pieces are links)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import policy_for

import stockade
from stockade.errors import ChangesError
from stockade.lifecycle import changes as changes_store

pytestmark = pytest.mark.usefixtures("linux")
REPO = str(Path(__file__).resolve().parent.parent)


def overlaid(workspace: Path) -> stockade.Result:
    result = stockade.run(["sh", "-c", "echo new > made"],
                          policy_for(workspace="overlay"), workspace=workspace, text=True)
    assert result.returncode == 0, result.stderr
    return result


def writable_by_others(top: str) -> list[str]:
    """Every directory or file of the change set's own structure (its upper layers' contents
    are the command's, with the modes it chose) that a group or other user may write."""
    found = []
    for where, dirs, files in os.walk(top):
        if os.path.basename(where) == changes_store.UPPER:
            dirs[:] = []  # (the upper directory itself shows the write root's mode)
            continue
        for name in [*dirs, *files]:
            if os.lstat(os.path.join(where, name)).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                found.append(os.path.relpath(os.path.join(where, name), top))
    return found


def test_a_change_set_is_private_whatever_the_umask(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    old = os.umask(0)
    try:
        result = overlaid(workspace)
    finally:
        os.umask(old)
    try:
        assert writable_by_others(os.path.dirname(result.changes.path)) == []
    finally:
        result.changes.discard()


def stockade_apply(state: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "apply"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO,
                                                      "STOCKADE_STATE_DIR": state})


def test_a_planted_change_set_is_refused(tmp_path):
    """G1's plant: a set made from another run's, its roots turned to a directory the run was
    never granted and its `created` in the future (so it is the newest): refused, typed, and
    nothing is written there."""
    workspace, victim = tmp_path / "ws", tmp_path / "victim"
    workspace.mkdir()
    victim.mkdir()
    result = overlaid(workspace)
    path = result.changes.path
    meta = json.loads(Path(path, "meta.json").read_text())
    meta.update(roots=[str(victim)], created=time.time() + 3600)
    Path(path, "meta.json").write_text(json.dumps(meta))
    done = stockade_apply(os.environ["STOCKADE_STATE_DIR"])
    assert done.returncode != 0 and "changes_untrusted" in done.stderr, done.stderr
    assert list(victim.iterdir()) == []
    result.changes.discard()


@pytest.mark.parametrize("spoil", ["store", "set", "meta", "link"])
def test_a_store_others_could_write_is_refused(tmp_path, spoil):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = overlaid(workspace)
    path = Path(result.changes.path)
    if spoil == "store":
        path.parent.chmod(0o777)
    elif spoil == "set":
        path.chmod(0o770)
    elif spoil == "meta":
        (path / "meta.json").chmod(0o666)
    else:
        (path / "meta.json").rename(path / "meta.real")
        (path / "meta.json").symlink_to(path / "meta.real")
    try:
        with pytest.raises(ChangesError) as refused:
            changes_store.load().apply()
        assert refused.value.code == "changes_untrusted"
        assert not (workspace / "made").exists()
    finally:
        path.parent.chmod(0o700)
        path.chmod(0o700)
        if spoil == "link":
            (path / "meta.json").unlink()
            (path / "meta.real").rename(path / "meta.json")
        result.changes.discard()
