"""The home reached through a bind mount is still the home (issue 29 B1): the same directory
mounted at a second path (a data disk's home/ bound on /home, a home bound into a chroot or at
/srv/...) is decided by identity (stockade/lifecycle/aliases.py), not by its path. A real
child runs with that second path as its workspace, in a mount namespace of the test's own
(the mount is seen by nothing else); every check of what happened is made on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, PYTHON_ROOT

import stockade

pytestmark = [pytest.mark.usefixtures("linux"),
              pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")]

# In the sandbox, in the workspace (the home's second path): one line per attempt.
ATTACK = """
import errno, os
def attempt(what, path):
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as f:
            f.write("[core]\\n\\tfsmonitor = touch /tmp/escaped\\n")
        print(what + ": DONE")
    except OSError as exc:
        print(what + ": " + errno.errorcode[exc.errno])
for what, path in (("home code", ".config/git/config"), ("home code", ".local/bin/git"),
                   ("home code", ".bash_aliases"), ("home code", "bin/git"),
                   ("state", "var/stockade/planted"), ("everyday", "notes/entry")):
    attempt(what + " " + path, path)
"""

# In a private mount namespace: the home bound at the second path, a run there, and for an
# overlay the user's `apply` (HOME the home again); what happened, as JSON.
CHILD = """
import json, os, subprocess, sys
from dataclasses import replace
import stockade
from stockade.errors import ChangesError
from stockade.policy import preset
home, alias, mode, run_home, read, attack = sys.argv[1:7]
subprocess.run(["mount", "--bind", home, alias], check=True)
base = preset("workspace-write")
fs = replace(base.filesystem, deny=(), workspace=mode,
             read=base.filesystem.read + tuple(json.loads(read)))
os.environ["HOME"] = run_home
result = stockade.run([sys.executable, "-c", attack], replace(base, filesystem=fs),
                      workspace=alias, text=True)
found = {"exit": result.returncode, "stderr": result.stderr,
         "lines": dict(line.split(": ", 1) for line in result.stdout.splitlines())}
if result.changes is not None:
    os.environ["HOME"] = home
    try:
        result.changes.apply()
        found["apply"] = "applied"
    except ChangesError as exc:
        found["apply"] = exc.code
        found["refused"] = str(exc)
        result.changes.discard()
print(json.dumps(found))
"""

EXISTING = {".config/git/config": "[user]\n\tname = me\n", ".local/bin/tool": "#!/bin/sh\n"}
UNMADE = [".local/bin/git", ".bash_aliases", "bin", "var/stockade/planted"]


def run_through_alias(tmp_path: Path, mode: str, run_home: Path,
                      monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    home = tmp_path / "home"
    for name, text in EXISTING.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    alias = tmp_path / "srv" / "alias"
    alias.mkdir(parents=True)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    # (Stockade's state directory in that home, where only its mask keeps it: not hidden)
    env = {**os.environ, "STOCKADE_STATE_DIR": str(home / "var" / "stockade"),
           # (the package these tests import: a mutant's copy's, scripts/mutants.py)
           "PYTHONPATH": str(Path(stockade.__file__).parent.parent)}
    read = [] if PYTHON_ROOT.startswith("/usr") else [PYTHON_ROOT]
    done = subprocess.run(["unshare", "-m", "--propagation", "private", PYTHON, "-c", CHILD,
                           str(home), str(alias), mode, str(run_home), json.dumps(read),
                           ATTACK], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["exit"] == 0, found
    assert not os.listdir(alias)  # (the mount was the child's own)
    return home, found


def test_a_direct_run_through_a_bind_mount_keeps_the_home_code_and_the_state(
        tmp_path, monkeypatch):
    """B1: the workspace is the home's second path. The home's hidden entries (git's XDG
    configuration, ~/.local/bin, a new .bash_aliases), its HOME_CODE (~/bin) and Stockade's
    state directory in the home are kept there as by the home's own path: each write fails
    and nothing of them changes on the host, while the rest of the home is written. Failed
    before: every attempt DONE."""
    home = tmp_path / "home"
    found = run_through_alias(tmp_path, "direct", home, monkeypatch)[1]
    lines = found["lines"]
    assert lines.pop("everyday notes/entry") == "DONE", found
    assert all(how != "DONE" for how in lines.values()), found
    for name, text in EXISTING.items():
        assert (home / name).read_text() == text, name
    for name in UNMADE:
        assert not os.path.lexists(home / name), name
    assert (home / "notes" / "entry").read_text().startswith("[core]")
    assert not os.path.exists("/tmp/escaped")


def test_apply_knows_the_home_through_a_bind_mount(tmp_path, monkeypatch):
    """B1: an overlaid run of the home's second path, whose HOME was another (an agent's: its
    view keeps nothing of this home), leaves the home's code in its set; the user's apply
    refuses it, `changes_refused`, naming each by the path applied, and nothing lands.
    Failed before: applied, the set's root not being the home by its path."""
    agent = tmp_path / "agent-home"
    agent.mkdir()
    home, found = run_through_alias(tmp_path, "overlay", agent, monkeypatch)
    assert found.get("apply") == "changes_refused", found
    for name in (".config/git", ".local/bin/git", ".bash_aliases", "bin/git"):
        assert f"{tmp_path / 'srv' / 'alias' / name}" in found["refused"], found
    for name, text in EXISTING.items():
        assert (home / name).read_text() == text, name
    for name in [*UNMADE, "notes"]:
        assert not os.path.lexists(home / name), name


def test_a_directory_below_the_home_bound_elsewhere_is_no_home(tmp_path):
    """Control: only what shows the home is the home. A project of the home bound at a second
    path keeps its own hidden files writable (aliases.within names nothing there)."""
    from stockade.lifecycle import aliases

    project = tmp_path / "home" / "src" / "project"
    project.mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    script = ("import json, subprocess, sys\n"
              "from stockade.lifecycle import aliases\n"
              "subprocess.run(['mount', '--bind', sys.argv[1], sys.argv[2]], check=True)\n"
              "t = aliases.table()\n"
              "print(json.dumps([aliases.within(sys.argv[2], p, t) for p in sys.argv[3:]]))\n")
    places = [str(tmp_path / "home"), str(tmp_path / "home" / ".config"), str(project / "x")]
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           script, str(project), str(other), *places], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(
                              Path(aliases.__file__).parent.parent.parent)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[], [], [str(other / "x")]]


def test_a_root_inside_the_state_directory_under_another_path_is_refused(tmp_path):
    """B1: a write root that is a directory of Stockade's state directory, named through a
    bind mount of it, is refused as the state directory's own path is (failed before:
    compiled, the state's ledger the command's to write)."""
    state = tmp_path / "state"
    (state / "inner").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    other = tmp_path / "other"
    other.mkdir()
    script = ("import subprocess, sys\n"
              "from stockade.errors import PolicyError\n"
              "from stockade.launch.compile import CompileContext, compile_policy\n"
              "from stockade.policy import preset\n"
              "subprocess.run(['mount', '--bind', sys.argv[1], sys.argv[2]], check=True)\n"
              "try:\n"
              "    compile_policy(preset('workspace-write'), ['true'],\n"
              "                   CompileContext.current(sys.argv[2] + '/inner'))\n"
              "    print('compiled')\n"
              "except PolicyError as exc:\n"
              "    print(exc.code, 'Stockade' in str(exc))\n")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           script, str(state), str(other)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "STOCKADE_STATE_DIR": str(state),
                                           "PYTHONPATH": str(Path(stockade.__file__).parent
                                                             .parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "policy_invalid True", done.stdout
