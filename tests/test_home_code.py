"""What of the home makes host programs run code is not the command's to write when its
workspace is the home (issue 29 A2, M3): every top-level hidden entry and what else
policy.model.HOME_CODE names (~/bin, ~/go): what exists is read-only and immovable, what does
not cannot be made, by any call, while the rest of the home stays writable (and a private
home, `filesystem.home = "private"`, holds the command's caches and configuration). A real
child attacks a fake home (HOME; the password database's home is another); every check of
what happened is made on the host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import ATTEMPT, PYTHON, policy_for

import stockade

pytestmark = pytest.mark.usefixtures("linux")

# One line per attempt, `what: DONE` or `what: ERRNO`; the paths are the home's.
ATTACK = ATTEMPT + """
import json, os, sys
def write(path, mode="a"):
    with open(path, mode) as f:
        f.write("[core]\\n\\tfsmonitor = touch /tmp/escaped\\n")
def made(path):
    write("scratch")
    os.rename("scratch", path)
for name in json.loads(sys.argv[1]):
    attempt("write " + name, lambda: write(name))
for name in json.loads(sys.argv[2]):
    attempt("rename " + name, lambda: os.rename(name, name + ".moved"))
for name in json.loads(sys.argv[3]):
    attempt("create " + name, lambda: write(name, "x"))
    attempt("mkdir " + name, lambda: os.mkdir(name))
    attempt("symlink " + name, lambda: os.symlink("/tmp/evil", name))
    attempt("rename-to " + name, lambda: made(name))
if sys.argv[5] == "direct":  # (an overlay's apply refuses the deletion: changes_refused)
    for name in (".vimrc", "bin"):  # (links: gone, not made again)
        attempt("unlink " + name, lambda: os.unlink(name))
        attempt("create " + name, lambda: os.symlink("/tmp/evil", name))
for name in json.loads(sys.argv[4]):
    attempt("everyday " + name, lambda: (os.makedirs(os.path.dirname(name) or ".",
                                                     exist_ok=True), write(name, "x")))
attempt("mkdir .", lambda: os.mkdir("."))  # (no new name: the kernel's answer)
attempt("mkdir ..", lambda: os.mkdir(".."))
"""

# Existing entries (their contents), entries the command then writes into or renames
EXISTING = {".config/git/config": "[user]\n\tname = me\n", ".local/bin/tool": "#!/bin/sh\n",
            "dotfiles/vimrc": "set nocompatible\n", ".m2/settings.xml": "<settings/>\n",
            "dotfiles/bin/tool": "#!/bin/sh\n"}
WRITTEN = [".config/git/config", ".local/bin/tool", "dotfiles/vimrc", ".vimrc",
           "dotfiles/bin/tool", "bin/tool"]
RENAMED = [".config/git", ".config", ".local/bin", ".local"]
# Missing entries, the directories on the way to some of them missing too
UNMADE = [".bash_aliases", ".tmux.conf", ".local/lib", ".cargo/config.toml", ".psqlrc",
          ".config/systemd/user", ".config/environment.d", ".emacs.d", ".local/bin/git",
          ".config/git/attributes",
          # (issue 29 M1: a sample of what was missed; run on the host: pyenv's shims, the
          # script rustup's line in ~/.profile sources)
          ".pyenv", ".cargo/env", ".sqliterc", ".config/lesskey", ".local/share/systemd/user",
          ".local/share/dbus-1/services", "go/bin", ".vscode-server", ".gradle/init.d",
          ".tcshrc", ".config/containers", ".bashrc.d", ".local/share/mise",
          # (issue 29 M3: every hidden entry, whatever its name: less's compiled lesskey,
          # node's last resort of require(), cpan's configuration, package caches host builds
          # run; D1: the directories a launch made for the list's entries, then filled)
          ".less", ".node_modules", ".cpan", ".m2/repository", ".gradle", "go", ".cache",
          ".npm", ".config/htop", ".local/share",
          # (attack 6: what interpreters load from the home by name, not hidden)
          "node_modules", "perl5", "miniconda3"]
# What stays the command's: the home's other names, hidden names deeper down
EVERYDAY = ["notes", "project/.cache/tool/entry", "project/.venv/lib/site.py"]


def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    for name, text in EXISTING.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    (home / ".vimrc").symlink_to("dotfiles/vimrc")
    (home / "bin").symlink_to("dotfiles/bin")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


def attack(home: Path, mode: str) -> dict[str, str]:
    args = [json.dumps(part) for part in (WRITTEN, RENAMED, UNMADE, EVERYDAY)]
    result = stockade.run([PYTHON, "-c", ATTACK, *args, mode],
                          policy_for(deny=(), workspace=mode), workspace=home, text=True)
    assert result.returncode == 0, result.stderr
    if result.changes is not None:  # (overlay: what the run left is applied as the user would)
        result.changes.apply(home_config=True)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    return lines


@pytest.mark.parametrize("mode", ["direct", "overlay"])
def test_the_home_code_is_not_the_commands_to_write(tmp_path, monkeypatch, mode):
    """A2: with the home as its workspace, a real child writes into, renames and makes each
    entry by every call that makes a name; each fails and nothing of it changes on the host,
    while its caches and other configuration are written. Failed before: every attempt DONE
    (direct), and the overlay's apply landed them."""
    home = fake_home(tmp_path, monkeypatch)
    lines = attack(home, mode)
    done = sorted(what for what, how in lines.items()
                  if how == "DONE" and not what.startswith(("everyday", "unlink")))
    assert done == [], lines
    for name in EVERYDAY:
        assert lines[f"everyday {name}"] == "DONE", lines
        assert (home / name).read_text().startswith("[core]"), name
    for name, text in EXISTING.items():
        assert (home / name).read_text() == text, name
    for name in UNMADE:
        assert not os.path.lexists(home / name), name
    if mode == "direct":  # (the link may go, not come back)
        assert lines["create .vimrc"] == lines["create bin"] == "EACCES", lines
    assert not os.path.exists("/tmp/evil")
    assert sorted(os.listdir(home / ".config" / "git")) == ["config"]
    left = {".vimrc", "bin"} if mode == "overlay" else set()  # (direct: unlinked)
    assert set(os.listdir(home)) == {".config", ".local", ".m2", "dotfiles", "notes", "scratch",
                                     "project"} | left
    assert os.listdir(home / ".m2") == ["settings.xml"]
    assert lines["mkdir ."] == lines["mkdir .."] == "EEXIST", lines


def test_the_landlock_tier_refuses_a_write_root_where_the_homes_code_would_be_made(
        tmp_path, monkeypatch):
    """Landlock rules hold paths that exist: with ~/.config a write root, the tier could not
    stop `~/.config/systemd/user` being made (a real child made it). Refused, typed, naming
    the way that works; a write root elsewhere runs."""
    import subprocess
    import sys

    home = fake_home(tmp_path, monkeypatch)
    for denied in ("gcloud", "gh"):  # (credential stores every preset denies: made first)
        (home / ".config" / denied).mkdir(mode=0o700)
    project = tmp_path / "project"
    project.mkdir()
    run = [sys.executable, "-m", "stockade", "run", "--isolation", "landlock"]
    # (the package these tests import: a mutant's copy's, scripts/mutants.py)
    env = {**os.environ, "PYTHONPATH": str(Path(stockade.__file__).parent.parent)}
    refused = subprocess.run([*run, "--write", str(home / ".config"), "--", "mkdir", "-p",
                              str(home / ".config" / "systemd" / "user")],
                             cwd=project, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 70, refused
    assert "unenforceable:filesystem.host_code" in refused.stderr, refused.stderr
    assert "isolation namespaces" in refused.stderr, refused.stderr
    assert not (home / ".config" / "systemd" / "user").exists()
    ran = subprocess.run([*run, "--", "true"], cwd=project, capture_output=True, text=True,
                         timeout=60, env=env)
    assert ran.returncode == 0, ran.stderr


def test_the_home_code_in_xdg_data_home_elsewhere_is_kept(tmp_path, monkeypatch):
    """Issue 29 M1: $XDG_DATA_HOME set outside the home holds systemd's and D-Bus's user
    units as ~/.local/share would: a real child writing that directory cannot make them,
    while the rest of it is its to write (failed before: both made)."""
    fake_home(tmp_path, monkeypatch)
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    made = ["systemd/user/x.service", "dbus-1/services/x.service", "tool/state"]
    script = "; ".join(f"mkdir -p {os.path.dirname(p)} && echo x > {p}" for p in made)
    result = stockade.run(["sh", "-c", script + "; true"], policy_for(deny=()),
                          workspace=data, text=True)
    assert result.returncode == 0, result.stderr
    assert not (data / "systemd" / "user").exists() and not (data / "dbus-1" / "services").exists()
    assert (data / "tool" / "state").read_text() == "x\n"


# Round 5's plants (issue 29 M3), each run by a host program shown doing so: less's compiled
# lesskey (its #env LESSOPEN), node's last resort of require(), cpan's configuration; and a
# package cache host builds run (D1: in a directory the launch had made).
PLANTS = ["printf x > .less", "mkdir -p .node_modules/atk && echo x > .node_modules/atk/index.js",
          "mkdir -p .cpan/CPAN && echo x > .cpan/CPAN/MyConfig.pm",
          "mkdir -p .m2/repository/atk && echo x > .m2/repository/atk/atk.jar",
          "mkdir -p go/pkg/mod && echo x > go/pkg/mod/atk.go"]


def tree(top: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), top)
                  for d, dirs, files in os.walk(top) for n in dirs + files)


def test_no_hidden_entry_of_the_home_is_made_nor_any_directory_by_the_launch(tmp_path,
                                                                             monkeypatch):
    """Issue 29 M3, D1: a launch alone (`true`) with the home as its workspace leaves it as it
    was (before: it made .cargo, .gradle, .m2, go, .config/systemd, ... empty), and a real
    child's plants in hidden entries the list lacked fail and leave nothing, while a plain
    file is written (before: every plant landed)."""
    home = fake_home(tmp_path, monkeypatch)
    (home / ".local" / "state" / "stockade").mkdir(parents=True)  # (Stockade's, made to mask)
    before = tree(home)
    policy = policy_for(deny=())
    assert stockade.run(["true"], policy, workspace=home).returncode == 0
    assert tree(home) == before
    script = " ; ".join([*PLANTS, "echo x > notes", "true"])
    result = stockade.run(["sh", "-c", script], policy, workspace=home, text=True)
    assert result.returncode == 0, result.stderr
    assert tree(home) == sorted([*before, "notes"]), tree(home)


def test_a_private_home_keeps_the_caches_of_a_command_whose_workspace_is_the_home(
        tmp_path, monkeypatch):
    """The everyday job under the stronger rule: with the home as its workspace and
    `filesystem.home = "private"` (its place in the home, as a rootless user's: inside
    ~/.local, which is kept whole), HOME is the private home, where npm's and pip's caches
    are written and kept; the real home's hidden entries stay out of reach."""
    from stockade.lifecycle import statedir
    from stockade.lifecycle.homes import home_for

    home = fake_home(tmp_path, monkeypatch)
    state = home / ".local" / "state" / "stockade"
    monkeypatch.setattr(statedir, "key_dir", lambda: str(state))
    script = (f'mkdir -p "$HOME/.npm/_cacache" "$HOME/.cache/pip" && echo x > "$HOME/.npm/'
              f'_cacache/index" && echo x > "$HOME/.cache/pip/wheel" && echo "HOME=$HOME"; '
              f"mkdir {home}/.cache || echo refused; echo x > {home}/.local/cache || echo refused")
    result = stockade.run(["sh", "-c", script], policy_for(deny=(), home="private"),
                          workspace=home, text=True)
    private = home_for(os.path.realpath(home), str(state))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"HOME={private}", "refused", "refused"], result
    for cache in (".npm/_cacache/index", ".cache/pip/wheel"):
        assert Path(private, cache).read_text() == "x\n", cache
    assert not (home / ".cache").exists() and not (home / ".local" / "cache").exists()


def test_a_write_root_inside_a_hidden_entry_beside_the_home_keeps_the_homes_code(
        tmp_path, monkeypatch):
    """`--write ~/.config` beside the home as the workspace: the exact grant is the command's
    to write, as ever, but for what of it runs code (HOME_CODE: git's configuration, which a
    real child cannot rewrite; systemd's user units, which it cannot make)."""
    home = fake_home(tmp_path, monkeypatch)
    script = ("mkdir -p .config/htop && echo x > .config/htop/htoprc; "
              "echo x >> .config/git/config; mkdir -p .config/systemd/user; true")
    result = stockade.run(["sh", "-c", script],
                          policy_for(deny=(), write=("{workspace}", "{workspace}/.config")),
                          workspace=home, text=True)
    assert result.returncode == 0, result.stderr
    assert (home / ".config" / "htop" / "htoprc").read_text() == "x\n"
    assert (home / ".config" / "git" / "config").read_text() == EXISTING[".config/git/config"]
    assert not (home / ".config" / "systemd").exists()


@pytest.mark.parametrize("workspace", ["as-named", "resolved"])
def test_a_home_reached_through_a_link_keeps_every_hidden_entry(tmp_path, monkeypatch,
                                                               workspace):
    """Issue 29 L2 (attack 6): with $HOME through a link (`/home -> /data/home`), write roots
    are resolved but the homes were not, so the whole-hidden-entries rule was skipped and a
    direct run wrote ~/.less and ~/.node_modules (which less and node then run). Now every
    hidden name is refused there too, and nothing of the home changes."""
    real = tmp_path / "data" / "home"
    real.mkdir(parents=True)
    (real / ".existing").write_text("kept\n")
    (tmp_path / "link").symlink_to(real.parent)
    home = tmp_path / "link" / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    names = [".less", ".node_modules", ".existing"]
    result = stockade.run([PYTHON, "-c", ATTACK, "[\".existing\"]", "[]", json.dumps(names[:2]),
                           "[]", "direct"], policy_for(deny=()),
                          workspace=home if workspace == "as-named" else real, text=True)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines and all(how != "DONE" for how in lines.values()), lines
    # (what the attack may make: a plain name; Stockade's own state directory, made to mask it)
    assert set(os.listdir(real)) - {"scratch", ".local"} == {".existing"}
    assert (real / ".existing").read_text() == "kept\n"
