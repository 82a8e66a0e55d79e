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
from conftest import PYTHON, policy_for

import stockade
from stockade.errors import ChangesError
from stockade.lifecycle import changes as changes_store
from stockade.lifecycle import statedir

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


def test_a_set_dated_in_the_future_is_refused_even_with_a_seal_that_verifies(tmp_path):
    """The store's own check, apart from the seal: a set whose `created` lies in the future
    (so that it is the newest) is never acted on, even sealed again under the user's own key
    (which no sandbox reads): only the date decides here."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = overlaid(workspace)
    path = Path(result.changes.path)
    meta = json.loads((path / "meta.json").read_text())
    meta["created"] = time.time() + 3600
    key = changes_store.changeseal.read_key(changes_store.changeseal.key_dir())
    meta["seal"] = changes_store.changeseal.seal(key, meta, [(path / "base-0.json").read_bytes()])
    (path / "meta.json").write_text(json.dumps(meta))
    try:
        done = stockade_apply(os.environ["STOCKADE_STATE_DIR"])
        assert done.returncode != 0 and "in the future" in done.stderr, done.stderr
        assert not (workspace / "made").exists()
    finally:
        meta["created"] = time.time()
        (path / "meta.json").write_text(json.dumps(meta))
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


# --- the seal: apply trusts a set's roots only on a record the user's key vouches for --------

PLANT = r"""
import json, os, sys, time
state, victim = sys.argv[1], sys.argv[2]
run = "1" * 32
path = os.path.join(state, "changes", run)
os.makedirs(os.path.join(path, "layers", "0", "upper"), mode=0o700)
os.chmod(state, 0o700)
os.chmod(os.path.join(state, "changes"), 0o700)
os.mkdir(os.path.join(path, "layers", "0", "work"), 0o700)
with open(os.path.join(path, "layers", "0", "upper", "planted"), "w") as f:
    f.write("written outside by a planted change set\n")
meta = {"format": "stockade-changes", "version": 1, "id": run, "created": time.time() - 5,
        "argv": ["true"], "roots": [victim], "protected": [], "deny": [],
        "git": "read-write", "status": "finished", "exit_code": 0, "seal": "0" * 64}
for name, data in (("meta.json", meta), ("base-0.json", {})):
    with open(os.path.join(path, name), "w") as f:
        json.dump(data, f)
    os.chmod(os.path.join(path, name), 0o600)
print("planted")
"""


def test_a_change_set_a_sandbox_planted_is_refused(tmp_path):
    """G1's plant as a sandbox makes it: a real command inside a sandbox makes a state
    directory in its workspace with a set whose root is a directory it was never granted,
    made as Stockade makes one (modes 0700/0600, no links, `created` in the past); the host's
    `stockade apply` with that state directory refuses it (the user's key never vouched for
    it) and nothing lands in the victim directory (failed before: applied)."""
    workspace, victim = tmp_path / "ws", tmp_path / "victim"
    workspace.mkdir()
    victim.mkdir()
    planted = stockade.run(["python3", "-c", PLANT, str(workspace / "state"),
                            str(victim)], policy_for(), workspace=workspace, text=True)
    assert planted.stdout.strip() == "planted", planted.stderr
    assert list(victim.iterdir()) == []  # (the sandbox itself could not write there)
    done = stockade_apply(str(workspace / "state"))
    assert done.returncode == 1 and "changes_untrusted" in done.stderr, done.stderr
    assert "stockade discard" in done.stderr and "Traceback" not in done.stderr
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("edit", ["roots", "protected", "baseline"])
def test_a_set_whose_grant_was_edited_is_refused(tmp_path, edit):
    """meta.json's roots (or protections, or the baseline beside it) rewritten after the run,
    `created` untouched, so that the store's checks all pass: the seal refuses it (failed
    before for roots: `made` landed in the victim directory)."""
    workspace, victim = tmp_path / "ws", tmp_path / "victim"
    workspace.mkdir()
    victim.mkdir()
    result = overlaid(workspace)
    path = Path(result.changes.path)
    meta = json.loads((path / "meta.json").read_text())
    if edit == "roots":
        meta["roots"] = [str(victim)]
    elif edit == "protected":
        meta["protected"] = []
    else:
        (path / "base-0.json").write_text(json.dumps({"made": ["f", 0o644, 4, "x"]}))
    (path / "meta.json").write_text(json.dumps(meta))
    try:
        done = stockade_apply(os.environ["STOCKADE_STATE_DIR"])
        assert done.returncode == 1 and "seal does not verify" in done.stderr, done.stderr
        assert list(victim.iterdir()) == [] and not (workspace / "made").exists()
    finally:
        result.changes.discard()


def test_a_set_sealed_with_its_own_stores_key_is_refused(tmp_path):
    """A real set copied into another store, its roots turned to a directory never granted
    and sealed again under a key of that store's own (where an older Stockade kept it, and
    under the name this one uses): refused, the store's key vouches for nothing (C1; failed
    before: the copy's key verified it, `made` landed in the victim directory)."""
    workspace, victim, other = tmp_path / "ws", tmp_path / "victim", tmp_path / "other-state"
    workspace.mkdir()
    victim.mkdir()
    result = overlaid(workspace)
    other.mkdir(mode=0o700)
    (other / "changes").mkdir(mode=0o700)
    key = changes_store.changeseal.make_key(str(other))
    (other / "changes.key").write_bytes(key)
    (other / "changes.key").chmod(0o600)
    try:
        source, copy = Path(result.changes.path), other / "changes" / result.changes.id
        (copy / "layers" / "0").mkdir(mode=0o700, parents=True)
        base = (source / "base-0.json").read_bytes()
        meta = json.loads((source / "meta.json").read_text())
        meta["roots"] = [str(victim)]
        meta["seal"] = changes_store.changeseal.seal(key, meta, [base])
        (copy / "meta.json").write_text(json.dumps(meta))
        (copy / "base-0.json").write_bytes(base)
        for name in ("meta.json", "base-0.json"):
            (copy / name).chmod(0o600)
        changes_store.copy_layer(result.changes.upper(0), str(copy / "layers/0/upper"))
        (copy / "layers/0/work").mkdir(mode=0o700)
        done = stockade_apply(str(other))
        assert done.returncode == 1 and "seal does not verify" in done.stderr, done.stderr
        assert list(victim.iterdir()) == [] and not (workspace / "made").exists()
    finally:
        result.changes.discard()


@pytest.mark.parametrize("older", ["unsealed", "sealed beside its set"])
def test_a_set_of_an_older_stockade_is_refused_and_says_to_discard_it(tmp_path, older):
    """A set with no seal (as versions before the seal wrote them), or with one made under a
    key beside the sets (as versions before C1 did: an HMAC with no scheme), is never applied
    unverified; the refusal says how to proceed, and the discard it names works."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = overlaid(workspace)
    path = Path(result.changes.path)
    meta = json.loads((path / "meta.json").read_text())
    if older == "unsealed":
        del meta["seal"]
    else:
        meta["seal"] = meta["seal"].removeprefix(changes_store.changeseal.SCHEME)
    (path / "meta.json").write_text(json.dumps(meta))
    state = os.environ["STOCKADE_STATE_DIR"]
    done = stockade_apply(state)
    assert done.returncode == 1 and "changes_untrusted" in done.stderr, done.stderr
    assert f"stockade discard {result.changes.id}" in done.stderr
    assert not (workspace / "made").exists()
    dropped = subprocess.run([sys.executable, "-m", "stockade", "discard", result.changes.id],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": state})
    assert dropped.returncode == 0 and not path.exists(), dropped.stderr


def test_the_key_is_the_users_alone_and_a_sealed_set_applies(tmp_path, monkeypatch):
    # (a key of this test's own: the user's real one is shared with every other run)
    monkeypatch.setattr(statedir, "key_dir", lambda: str(tmp_path / "keys"))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = overlaid(workspace)
    key = tmp_path / "keys" / changes_store.changeseal.KEY_NAME
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    key.chmod(0o644)
    try:
        with pytest.raises(ChangesError) as refused:
            changes_store.load(result.changes.id).apply()
        assert refused.value.code == "changes_untrusted" and str(key) in str(refused.value)
    finally:
        key.chmod(0o600)
    changes_store.load(result.changes.id).apply()
    assert (workspace / "made").read_text() == "new\n"


# --- C1: the key is where the password database says, never beside the sets ------------------

def test_the_key_is_kept_where_no_environment_moves_it(monkeypatch, tmp_path):
    """The key's place is the same whatever HOME, XDG_STATE_HOME and STOCKADE_STATE_DIR say
    (the agent's and the user's shell differ), and every launch masks it."""
    import pwd

    expected = statedir.key_dir()
    home = pwd.getpwuid(os.geteuid()).pw_dir
    assert expected == (statedir.ROOT_STATE_DIR if os.geteuid() == 0
                        else os.path.join(home, ".local", "state", "stockade"))
    for name in ("HOME", "XDG_STATE_HOME", "STOCKADE_STATE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name))
    assert statedir.key_dir() == expected
    assert expected in statedir.candidates(os.environ, str(tmp_path / "HOME"))


# A sandbox's forgery: every entry of a state directory, as Stockade makes one (modes 0700 and
# 0600, no links), written where the agent's environment does not look for one.
FORGE = r"""
import json, os, sys
for rel, mode, data in json.loads(sys.argv[1]):
    path = os.path.join(sys.argv[2], rel)
    if data is None:
        os.mkdir(path, mode)
    else:
        with open(path, "wb") as f:
            f.write(bytes.fromhex(data))
    os.chmod(path, mode)
print("forged")
"""


def test_a_state_directory_a_sandbox_built_whole_is_refused(tmp_path, monkeypatch):
    """C1: the agent's environment has no XDG_STATE_HOME, the user's shell has one. With the
    (fake) home as its workspace, a real sandboxed command cannot see the agent's state
    directory but builds the shell's whole: its own key (where an older Stockade read it and
    under this one's name) and a set sealed with it by Stockade's own seal code, whose root is
    ~/.ssh (denied in the run) and whose upper layer adds authorized_keys. The host's
    `stockade apply` in the shell's environment refuses it, typed, and ~/.ssh is untouched
    (failed before: applied, authorized_keys written)."""
    home = tmp_path / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    run, key, base = os.urandom(16).hex(), os.urandom(32), b"{}"
    meta = {"format": "stockade-changes", "version": 1, "id": run, "created": time.time() - 5,
            "argv": ["true"], "roots": [str(ssh)], "protected": [], "deny": [],
            "git": "writable", "status": "finished", "exit_code": 0}
    meta["seal"] = changes_store.changeseal.seal(key, meta, [base])
    # (a state home that is not hidden: no new hidden name can be made in a home that is a
    # write root, so that route is shut before the seal is asked)
    state, dirs = "xdgstate/stockade", f"xdgstate/stockade/changes/{run}"
    spec = [["xdgstate", 0o700, None], [state, 0o700, None],
            [f"{state}/changes.key", 0o600, key.hex()],
            [f"{state}/{changes_store.changeseal.KEY_NAME}", 0o600, key.hex()],
            [f"{state}/changes", 0o700, None], [dirs, 0o700, None],
            [f"{dirs}/meta.json", 0o600, json.dumps(meta).encode().hex()],
            [f"{dirs}/base-0.json", 0o600, base.hex()],
            [f"{dirs}/layers", 0o700, None], [f"{dirs}/layers/0", 0o700, None],
            [f"{dirs}/layers/0/upper", 0o700, None], [f"{dirs}/layers/0/work", 0o700, None],
            [f"{dirs}/layers/0/upper/authorized_keys", 0o644, b"ssh-ed25519 FORGED\n".hex()]]
    forged = stockade.run([PYTHON, "-c", FORGE, json.dumps(spec), str(home)],
                          policy_for(deny=(str(ssh),)), workspace=home, text=True)
    assert forged.stdout.strip() == "forged", forged.stderr
    assert (home / state / "changes.key").read_bytes() == key  # (the forgery is on the host)
    shell = {name: value for name, value in os.environ.items() if name != "STOCKADE_STATE_DIR"}
    done = subprocess.run([sys.executable, "-m", "stockade", "apply"], capture_output=True,
                          text=True, timeout=60,
                          env={**shell, "PYTHONPATH": REPO, "HOME": str(home),
                               "XDG_STATE_HOME": str(home / "xdgstate")})
    assert done.returncode == 1 and "changes_untrusted" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and f"stockade discard {run}" in done.stderr
    assert list(ssh.iterdir()) == []


def agent_run(workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              argv: list[str], policy: stockade.Policy) -> stockade.Result:
    """A run whose HOME (an agent's) is not `workspace`, the user's home as the shell that
    applies names it (C1): what its view keeps of the home (homecode.py) is not kept there,
    so its set holds what apply alone must refuse."""
    monkeypatch.setenv("HOME", str(tmp_path / "agent-home"))
    result = stockade.run(argv, policy, workspace=workspace, text=True)
    assert result.returncode == 0, result.stderr
    return result


def test_a_sealed_set_never_writes_credentials_or_start_up_files(tmp_path, monkeypatch):
    """Defence in depth (C1): a real run's set, sealed with this user's key, whose policy left
    ~/.ssh and ~/.bashrc writable (no deny, no protected names) is refused, typed, listing
    each: no change set writes a credential store or the home's start-up files, whatever its
    run was granted; nothing lands (failed before: both written)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    result = agent_run(home, tmp_path, monkeypatch, ["sh", "-c", "mkdir -p .ssh .config/git && "
                       "echo key > .ssh/authorized_keys && echo x > .bashrc && echo '[core] "
                       "fsmonitor = ./x' > .config/git/config && echo fine > notes"],
                       policy_for(workspace="overlay", deny=(), protected=()))
    monkeypatch.setenv("HOME", str(home))
    try:
        with pytest.raises(ChangesError) as refused:
            changes_store.load(result.changes.id).apply()
        assert refused.value.code == "changes_refused", refused.value
        text = str(refused.value)
        assert str(home / ".ssh") in text and str(home / ".bashrc") in text, text
        assert str(home / ".config" / "git") in text, text  # (attack G1: git's XDG config)
        assert str(home / "notes") not in text, text
        assert os.listdir(home) == [], os.listdir(home)
    finally:
        result.changes.discard()



def home_run(home: Path, made: list[str], monkeypatch: pytest.MonkeyPatch) -> stockade.Result:
    """An overlaid run with the home as its workspace that writes each of `made` (no
    credential store denied: a fake home has none, and a missing one is refused), its HOME
    another (agent_run); HOME is then the home again."""
    script = " && ".join(f"mkdir -p $(dirname {p}) && echo x > {p}" for p in made)
    result = agent_run(home, home.parent, monkeypatch, ["sh", "-c", script],
                       policy_for(workspace="overlay", deny=()))
    monkeypatch.setenv("HOME", str(home))
    return result


def shell_apply(home: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "apply", *options],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO, "HOME": str(home)})


def test_a_home_workspace_lands_its_configuration_only_when_asked(tmp_path, monkeypatch):
    """Issue 29 A1: an overlaid run with the (fake) home as its workspace writes, besides an
    ordinary file, configuration host programs read later (htop's, a cache, the home's own
    mode). `stockade apply` refuses the set, `changes_home_config`, naming each and the
    option, and writes nothing; `stockade apply --home-config` lands it. Failed before: the
    plain apply landed all of it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    made = [".config/htop/htoprc", ".cache/tool/entry", "notes"]
    result = home_run(home, [*made[:-1], "notes && chmod 750 ."], monkeypatch)
    before = sorted(os.listdir(home))
    plain = shell_apply(home)
    assert plain.returncode == 1 and "changes_home_config" in plain.stderr, plain.stderr
    assert "stockade apply --home-config" in plain.stderr and "Traceback" not in plain.stderr
    for path in [".config", ".cache", ""]:
        assert f" {home / path if path else home}:" in plain.stderr, (path, plain.stderr)
    assert f"{home / 'notes'}:" not in plain.stderr, plain.stderr
    assert sorted(os.listdir(home)) == before and stat.S_IMODE(home.stat().st_mode) == 0o700
    asked = shell_apply(home, "--home-config")
    assert asked.returncode == 0, asked.stderr
    for path in made:
        assert (home / path).read_text() == "x\n", path
    assert stat.S_IMODE(home.stat().st_mode) == 0o750
    assert result.changes.id not in [s.id for s in changes_store.pending()]


HOME_CODE_MADE = (".config/git/config", ".bash_aliases", ".local/bin/git", "bin/git", ".tmux.conf",
                  ".cargo/config.toml", ".config/systemd/user/x.service",
                  ".local/lib/python3.99/site-packages/zz.pth", ".config/environment.d/x.conf",
                  ".psqlrc", ".gdbinit", ".vim/plugin/x.vim", ".cargo/env",
                  ".pyenv/shims/python3", ".local/share/systemd/user/x.service",
                  ".config/lesskey", "go/bin/git")


def test_a_home_workspace_never_lands_home_code(tmp_path, monkeypatch):
    """Issue 29 A1: what makes a host program run code at its next start (changeapply.
    HOME_CODE: git's XDG configuration, a .pth in the user site-packages of every Python,
    ~/.local/bin, ~/bin, .bash_aliases, tmux, cargo, systemd --user, ...) is refused,
    `changes_refused`, even with --home-config, and nothing lands. Failed before for all but
    git's configuration and systemd --user (applied)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    result = home_run(home, [*HOME_CODE_MADE], monkeypatch)
    before = sorted(os.listdir(home))
    try:
        for options in ((), ("--home-config",)):
            done = shell_apply(home, *options)
            assert done.returncode == 1 and "changes_refused" in done.stderr, done.stderr
            for path in HOME_CODE_MADE:
                assert f"{home / path}:" in done.stderr, (path, done.stderr)
            assert sorted(os.listdir(home)) == before
    finally:
        result.changes.discard()


@pytest.mark.parametrize(("made", "code"), [(".psqlrc", "changes_refused"),
                                             (".config/htop/htoprc", "changes_home_config")])
def test_a_home_reached_through_a_link_is_still_the_home(tmp_path, monkeypatch, made, code):
    """Issue 29 L1: $HOME goes through a link (/home -> /var/home), the change set records its
    write root resolved. Its home code is still refused, `changes_refused`, even with
    --home-config, and its configuration still waits for --home-config: nothing lands (failed
    before: both applied by a plain `stockade apply`)."""
    real = tmp_path / "disk" / "user"
    real.mkdir(parents=True)
    (tmp_path / "home").symlink_to("disk")
    home = tmp_path / "home" / "user"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    result = home_run(home, [made], monkeypatch)
    try:
        for options in ((), ("--home-config",)) if code == "changes_refused" else ((),):
            done = shell_apply(home, *options)
            assert done.returncode == 1 and code in done.stderr, done.stderr
            assert not (real / made).exists()
    finally:
        result.changes.discard()


def test_a_project_workspace_in_the_home_applies_as_before(tmp_path, monkeypatch):
    """The everyday case is untouched: a project in the home, its own hidden files and bin/
    too, applies without the option."""
    home = tmp_path / "home"
    project = home / "src" / "proj"
    project.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    result = stockade.run(["sh", "-c", "mkdir -p .github bin && echo x > .github/ci.yml "
                           "&& echo x > bin/tool && echo x > notes"],
                          policy_for(workspace="overlay"), workspace=project, text=True)
    assert result.returncode == 0, result.stderr
    changes_store.load(result.changes.id).apply()
    assert (project / ".github" / "ci.yml").exists() and (project / "bin" / "tool").exists()


def test_a_set_is_made_when_another_discard_removes_the_empty_store_meanwhile(
        tmp_path, monkeypatch):
    """A discard removes the store once it is empty: one made by a run starting at that
    moment is made again, not a FileNotFoundError that loses the run (seen in CI with four
    overlaid runs at once)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state = str(tmp_path / "state")
    parent = changes_store.store(state)
    made = changes_store._private_dirs
    removals = []

    def made_then_removed(path: str) -> None:
        made(path)
        if path == parent and len(removals) < 2:
            os.rmdir(path)  # (what the other process's discard does to the empty store)
            removals.append(path)

    monkeypatch.setattr(changes_store, "_private_dirs", made_then_removed)
    made_set = changes_store.begin("a" * 32, ["true"], [str(workspace)], protected=(),
                                   git="protect", deny=(), state=state)
    try:
        assert removals == [parent, parent]
        assert os.path.isfile(os.path.join(made_set.path, "meta.json"))
    finally:
        made_set.finish(0)
        made_set.release()
        made_set.discard()


def test_a_set_another_discard_removes_meanwhile_is_not_found_not_untrusted(tmp_path,
                                                                            monkeypatch):
    """Attack 27 R1: a discard listing the store while another discard renamed a set aside
    said `changes_untrusted: ... cannot be read` of a set that was merely gone. A set that
    vanishes while it is checked is skipped; the only one gone, nothing is found."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state = str(tmp_path / "state")
    made_set = changes_store.begin("b" * 32, ["true"], [str(workspace)], protected=(),
                                   git="protect", deny=(), state=state)
    made_set.finish(0)
    made_set.release()
    check = changes_store.trusted

    def discarded_meanwhile(path: str, meta: dict) -> None:
        os.rename(path, path + "-aside")  # (what the other discard does first)
        check(path, meta)

    monkeypatch.setattr(changes_store, "trusted", discarded_meanwhile)
    with pytest.raises(ChangesError) as refused:
        changes_store.load(state=state)
    assert refused.value.code == "changes_not_found", refused.value
