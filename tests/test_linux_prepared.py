"""Spares prepared ahead for a launch's view (zygote.py): a run of launches with one policy
gets sandboxes whose mounts and confinement were made before the launch. Real children check
that such a sandbox is as closed as a fresh one, that it never carries another launch's own
state, and that a host change since it was prepared (a new protected name, a new denied path,
a new hard link, a re-made root) is seen by the next launch."""

from __future__ import annotations

import os
import socket

import pytest
from conftest import sandbox

pytestmark = pytest.mark.usefixtures("linux")


def prepared(workspace, argv=("true",), **changes):
    """Launch until one runs in a prepared spare (the first of a view cannot); its result."""
    for _ in range(3):
        r = sandbox(list(argv), workspace, **changes)
        if r.enforced.get("prepared_ahead"):
            return r
    raise AssertionError("no launch ran in a prepared spare")


def test_a_run_of_launches_uses_prepared_spares(ws):
    workspace, _ = ws
    first = sandbox(["true"], workspace)
    assert first.enforced["prepared_ahead"] is False
    assert prepared(workspace).exit_code == 0


def test_a_prepared_sandbox_is_as_closed_as_a_fresh_one(ws):
    """Writes outside the roots, reads outside them, a namespace, a TCP connection to a host
    listener: all refused in a prepared sandbox, and nothing outside changes."""
    workspace, outside = ws
    (outside / "secret").write_text("TOPSECRET")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = (f"cat {outside}/secret; echo pwned > {outside}/new; "
                  f"unshare -U true && echo UNSHARED; "
                  f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED; "
                  "echo done")
        r = prepared(workspace, ["bash", "-c", script])
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert r.stdout == b"done\n", r.stdout
    assert b"TOPSECRET" not in r.stdout
    assert sorted(os.listdir(outside)) == ["secret"]
    assert r.enforced["landlock"] and r.enforced["seccomp"]


def test_a_prepared_sandbox_has_only_its_own_launchs_environment(ws, monkeypatch):
    """The spare was prepared after a launch with another environment, argv and working
    directory: none of it reaches this one."""
    workspace, _ = ws
    (workspace / "sub").mkdir()
    monkeypatch.setenv("LANG", "C.UTF-8")
    policy_env = {"set": (("MARK", "first"),)}
    from dataclasses import replace

    from conftest import policy_for

    import stockade
    first = replace(policy_for(), env=replace(policy_for().env, **policy_env))
    stockade.run(["true"], first, workspace=workspace)
    second = policy_for()
    for _ in range(3):
        r = stockade.run(["sh", "-c", "echo ${MARK:-unset} $(pwd)"], second, workspace=workspace,
                         cwd=workspace / "sub")
        if r.enforced.get("prepared_ahead"):
            break
    assert r.enforced["prepared_ahead"]
    assert r.stdout.decode().split() == ["unset", str(workspace / "sub")]


def test_a_protected_name_made_after_a_launch_is_protected_at_the_next(ws):
    workspace, _ = ws
    prepared(workspace)  # a spare is now prepared for this view, made before .git existed
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    r = sandbox(["sh", "-c", "echo evil >> .git/config; echo evil > .git/hooks"], workspace)
    assert r.exit_code != 0
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    assert sorted(os.listdir(workspace / ".git")) == ["config"]
    assert r.enforced["protected_mounts"] >= 1


def test_a_denied_path_made_after_a_launch_is_hidden_at_the_next(ws):
    workspace, _ = ws
    deny = (str(workspace / "secret"),)
    prepared(workspace, deny=deny)  # prepared while nothing was there to hide
    (workspace / "secret").write_text("TOPSECRET")
    r = sandbox(["cat", "secret"], workspace, deny=deny)
    assert r.exit_code != 0
    assert b"TOPSECRET" not in r.stdout


def test_a_hard_link_made_after_a_launch_is_read_only_at_the_next(ws):
    workspace, outside = ws
    (outside / "target").write_text("original")
    prepared(workspace)
    os.link(outside / "target", workspace / "alias")
    r = sandbox(["sh", "-c", "echo evil > alias"], workspace)
    assert r.exit_code != 0
    assert (outside / "target").read_text() == "original"


def test_a_root_re_made_after_a_launch_is_the_one_the_next_launch_writes(ws):
    """A spare's bind mount holds the directory it was made from. Re-made under the same path
    (perhaps with the same inode number), the new directory is the one the next launch must
    write: nothing may vanish into the deleted one."""
    workspace, _ = ws
    prepared(workspace)
    os.rmdir(workspace)
    workspace.mkdir()
    r = sandbox(["sh", "-c", "echo kept > out"], workspace)
    assert r.exit_code == 0, r.stderr
    assert (workspace / "out").read_text() == "kept\n"
