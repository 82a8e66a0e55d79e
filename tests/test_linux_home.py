"""The command's home (`filesystem.home`): under the writable presets it is a directory of the
sandbox's own, one per workspace, kept between runs (stockade/lifecycle/homes.py). Real npm,
pip and git write their caches and global configuration there, the next run of the same
workspace finds them, another workspace does not, and the host's home is never written."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import ATTEMPT, PYTHON, policy_for, sandbox, unavailable
from test_linux_fs import snapshot

import stockade
from stockade.lifecycle import statedir
from stockade.lifecycle.homes import GIT_CONFIG, home_for

pytestmark = pytest.mark.usefixtures("linux")


@pytest.fixture
def host_home(ws, monkeypatch):
    """A home directory of the host's for this test (what `~` and `{home}` mean), empty."""
    _, outside = ws
    home = outside / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def tool(name: str) -> str:
    found = shutil.which(name, path="/usr/bin:/bin")
    if found is None:
        unavailable(f"{name} is not installed in /usr/bin")
    return found


def home_of(workspace, **changes) -> str:
    """HOME as a command in the sandbox of `workspace` sees it."""
    r = sandbox(["sh", "-c", 'echo "$HOME"'], workspace, **changes)
    assert r.exit_code == 0, r.stderr
    return r.stdout.decode().strip()


def test_npm_pip_and_git_keep_their_caches_and_configuration_in_a_private_home(ws, host_home):
    """npm (exit 254 before: it could not make ~/.npm), pip's cache and `git config --global`
    work, and what they wrote is there again at the next run of the same workspace."""
    workspace, outside = ws
    npm, git = tool("npm"), tool("git")
    first = sandbox(["sh", "-c", f"""set -e
        {npm} init -y > /dev/null && {npm} ls > /dev/null
        {git} config --global user.name sandboxer
        {git} config --global user.email sandboxer@example.invalid
        mkdir -p "$(python3 -m pip cache dir)/wheels/ab"
        touch "$(python3 -m pip cache dir)/wheels/ab/cached-1.0-py3-none-any.whl"
        echo done"""], workspace)
    assert (first.exit_code, first.stdout) == (0, b"done\n"), first.stderr.decode()
    home = home_of(workspace)
    assert home == home_for(os.path.realpath(workspace), statedir.key_dir())
    assert home != str(host_home) and not home.startswith(str(workspace))
    assert os.listdir(os.path.join(home, ".npm", "_logs")), "npm wrote no log in its home"
    second = sandbox(["sh", "-c", f"""set -e
        {git} init -q . && {git} commit -q --allow-empty -m by-the-sandbox
        {git} log -1 --format=%an
        python3 -m pip cache list"""], workspace)
    assert second.exit_code == 0, second.stderr.decode()
    assert second.stdout.decode().splitlines()[0] == "sandboxer"
    assert "cached-1.0-py3-none-any.whl" in second.stdout.decode()
    assert os.listdir(host_home) == []  # the host's home was never written
    other = outside / "other"
    other.mkdir()
    third = sandbox(["sh", "-c", f"{git} config --global user.name || echo unset"], other)
    assert third.stdout == b"unset\n" and home_of(other) != home


def test_the_private_home_gives_no_way_into_the_hosts(ws, host_home):
    """The host's home stays out of reach with a private one: writing there fails, the
    host's own git configuration is not read, and nothing of the host changes."""
    workspace, outside = ws
    (host_home / ".gitconfig").write_text("[user]\n\tname = host-user\n")
    before = snapshot(outside)
    r = sandbox(["sh", "-c", f"echo x > {host_home}/planted; cat {host_home}/.gitconfig; "
                 f"{tool('git')} config --global user.name || echo unset"], workspace)
    assert r.stdout == b"unset\n" and b"host-user" not in r.stdout + r.stderr
    assert snapshot(outside) == before


def test_a_private_home_is_refused_when_another_user_could_write_it(ws, host_home):
    """What the sandbox reads at its next run must be its own: a private home that is a
    symbolic link, or writable by others, is refused (typed), never used."""
    workspace, outside = ws
    home = home_of(workspace)
    os.chmod(home, 0o777)
    with pytest.raises(stockade.UnenforceableError) as refused:
        sandbox(["true"], workspace)
    assert refused.value.code == "unenforceable:filesystem.home" and home in refused.value.message
    shutil.rmtree(home)
    os.symlink(outside, home)
    with pytest.raises(stockade.UnenforceableError):
        sandbox(["true"], workspace)
    os.unlink(home)
    assert sandbox(["true"], workspace).exit_code == 0


def test_home_host_keeps_the_hosts_home_as_the_roots_say(ws, host_home):
    """`filesystem.home = "host"`: HOME is the host's, unwritable without a root for it (here
    below the sandbox's own /tmp, where what npm writes vanishes), and no private home is
    made."""
    workspace, _ = ws
    sandbox([tool("npm"), "ls"], workspace, home="host")
    assert home_of(workspace, home="host") == str(host_home)
    assert os.listdir(host_home) == []
    assert not os.path.exists(home_for(os.path.realpath(workspace), statedir.key_dir()))


@pytest.mark.parametrize("relayed", [False, True], ids=["captured", "relayed"])
def test_a_failure_in_the_hosts_home_says_which_knob_would_allow_it(ws, host_home, relayed,
                                                                     tmp_path):
    """Issue 32: with home = "host", a tool that fails writing its cache in the home said so
    in its own words only; now a `filesystem.home` violation names the knob (from stderr
    captured or relayed). Not for a failure elsewhere, a success, or a private home."""
    workspace, _ = ws
    fails = ["sh", "-c", 'mkdir "$HOME/.cache/tool"']
    elsewhere = ["sh", "-c", "mkdir /nonexistent/tool"]
    said = ["sh", "-c", 'echo "$HOME/.cache" >&2']

    def home_violations(argv, home):
        if not relayed:
            result = sandbox(argv, workspace, home=home)
        else:
            with open(tmp_path / "err", "wb") as err:
                result = stockade.run(argv, policy_for(home=home), workspace=workspace,
                                      stderr=err.fileno())
        return [v.detail for v in result.violations if v.kind == "filesystem.home"]

    found = home_violations(fails, "host")
    assert len(found) == 1 and 'filesystem.home = "private"' in found[0], found
    assert str(host_home) in found[0]
    assert home_violations(elsewhere, "host") == []
    assert home_violations(said, "host") == []
    assert home_violations(fails, "private") == []


def test_discarding_a_home_removes_what_the_command_made_read_only(ws, host_home):
    """A command leaves read-only directories holding files in its private home (issue 29,
    C1): discarding the home removes them whole (rootless, `rmtree(ignore_errors=True)` left
    them, and the home, behind)."""
    from stockade.lifecycle import homes
    workspace, _ = ws
    r = sandbox(["sh", "-c", 'cd "$HOME" && mkdir -p ro/in && echo x > ro/in/f && '
                 "chmod 555 ro/in ro && mkdir nox && echo y > nox/f && chmod 600 nox"],
                workspace)
    assert r.exit_code == 0, r.stderr
    home = home_for(os.path.realpath(workspace), statedir.key_dir())
    assert os.path.isfile(os.path.join(home, "ro", "in", "f"))
    homes.discard(str(workspace), statedir.key_dir())
    assert not os.path.lexists(home)


# A run's attempts on the private homes' directory (argv[1]) and on other workspaces' homes in
# it (the rest: one made by Stockade, one not yet made), one line each, `name: errno` or
# `name: DONE`; then what it lists there, and the everyday write in its own home.
CROSS = ATTEMPT + """
import errno, os, sys
homes, *others = sys.argv[1:]
def plant(home):
    os.makedirs(os.path.join(home, ".config", "git"), exist_ok=True)
    with open(os.path.join(home, ".config", "git", "config"), "a") as f:
        f.write('[core]\\n\\tfsmonitor = "touch PLANTED; false"\\n')
for index, home in enumerate(others):
    attempt(f"plant {index}", lambda: plant(home))
    attempt(f"rename {index}", lambda: os.rename(home, home + ".moved"))
attempt("rename homes", lambda: os.rename(homes, homes + ".moved"))
try:
    print("listed: " + ",".join(sorted(os.listdir(homes))))
except OSError as exc:
    print("listed: " + errno.errorcode[exc.errno])
with open(os.path.join(os.environ["HOME"], "cache"), "a") as f:
    f.write("kept\\n")
print("everyday: DONE")
"""


def test_a_run_never_reaches_another_workspaces_private_home(ws, host_home, monkeypatch):
    """Issue 29 H1: the private homes lie beside the seal key's directory, for an ordinary user in
    the home (`~/.local/state/stockade-homes`), under predictable names. A real command
    whose workspace is the home tries to plant a git configuration (run by `git status`) in
    the private home of workspace B (made) and of C (not made yet), to move them, and to
    list them: the homes' directory shows it its own home only and nothing of it can be
    written; B's next `git status` runs nothing of A's, and A's own home is kept between
    runs."""
    workspace, outside = ws
    state = host_home / ".local" / "state" / "stockade"  # (a rootless user's, in the home)
    monkeypatch.setattr(statedir, "key_dir", lambda: str(state))
    git = tool("git")
    assert sandbox([git, "init", "-q", "."], workspace).exit_code == 0
    other = outside / "other"
    other.mkdir()
    b_home, c_home = (home_for(os.path.realpath(w), str(state)) for w in (workspace, other))
    homes = os.path.dirname(b_home)
    before = snapshot(homes)
    for run in (1, 2):
        # (no credential stores denied: this home has none, which a run of it could make)
        r = sandbox([PYTHON, "-c", CROSS, homes, b_home, c_home], host_home, deny=())
        assert r.exit_code == 0, r.stderr.decode()
        got = dict(line.split(": ", 1) for line in r.stdout.decode().splitlines())
        a_home = home_for(os.path.realpath(host_home), str(state))
        assert got.pop("listed") == os.path.basename(a_home)
        assert got.pop("everyday") == "DONE"
        assert got and all(outcome in ("EROFS", "EBUSY", "EACCES") for outcome in got.values()), got
        assert open(os.path.join(a_home, "cache")).read() == "kept\n" * run
    own = os.path.basename(a_home)
    assert {k: v for k, v in snapshot(homes).items()
            if k.split("/")[0] != own and k != f".made/{own}"} == before  # (A's, by Stockade)
    assert not os.path.exists(c_home)
    r = sandbox([git, "status", "--short"], workspace)
    assert r.exit_code == 0, r.stderr.decode()
    assert not (workspace / "PLANTED").exists()


def test_a_private_home_stockade_did_not_make_is_remade(ws, host_home):
    """The homes' names are predictable: a directory already there that Stockade did not
    make (planted before the homes were masked, or made by an older Stockade) is removed and
    made afresh before the command runs: the planted git configuration, which `git status`
    would run, is gone, and the next run keeps the home Stockade made."""
    workspace, _ = ws
    home = home_for(os.path.realpath(workspace), statedir.key_dir())
    os.makedirs(os.path.join(home, ".config", "git"), mode=0o700)
    with open(os.path.join(home, GIT_CONFIG), "w") as f:
        f.write('[core]\n\tfsmonitor = "touch PLANTED; false"\n')
    git = tool("git")
    r = sandbox(["sh", "-c", f"{git} init -q . && {git} status --short && touch $HOME/kept"],
                workspace)
    assert r.exit_code == 0, r.stderr.decode()
    assert not (workspace / "PLANTED").exists()
    assert sorted(os.listdir(home)) == [".config", "kept"]
    assert not os.path.exists(os.path.join(home, GIT_CONFIG))
    assert sandbox(["true"], workspace).exit_code == 0
    assert os.path.exists(os.path.join(home, "kept"))  # (recorded: kept from now on)


# A run's plant in each private home of argv[1:] (made or not): git's configuration, which
# `git status` runs, and the home's `.made` record forged with what the run sees of it.
PLANT = """
import os, sys
for home in sys.argv[1:]:
    try:
        os.makedirs(os.path.join(home, ".config", "git"), exist_ok=True)
        with open(os.path.join(home, ".config", "git", "config"), "a") as f:
            f.write('[core]\\n\\tfsmonitor = "touch PLANTED; false"\\n')
        records = os.path.join(os.path.dirname(home), ".made")
        os.makedirs(records, exist_ok=True)
        info = os.stat(home)
        with open(os.path.join(records, os.path.basename(home)), "w") as f:
            f.write(f"{info.st_dev}:{info.st_ino}\\n")
        print("DONE")
    except OSError as exc:
        print(exc.strerror)
"""


def test_a_run_naming_another_state_directory_keeps_its_home_out_of_others_reach(
        ws, host_home, monkeypatch):
    """Issue 29 H2: workspace B runs with a state directory of its own (STOCKADE_STATE_DIR,
    a project's, here in the home); run A names none and its workspace is the home. A real
    command of A plants a git configuration (run by `git status`) and forges the `.made`
    record in B's private home (made by B's first run) and in C's (not made yet), both where
    that state directory would keep them and where the seal key's directory does (from the
    password database, in a rootless user's home). The homes follow the seal key's place,
    which every launch masks, not the state directory: B's and C's next `git status` run
    nothing of A's and B's home is as B left it (before: A's fsmonitor ran in B and C)."""
    workspace, outside = ws
    keys = host_home / ".local" / "state" / "stockade"
    monkeypatch.setattr(statedir, "key_dir", lambda: str(keys))
    b_state = str(host_home / "work" / "projB-state")
    git = tool("git")
    other = outside / "c"
    other.mkdir()

    def as_b(argv, where):
        monkeypatch.setenv("STOCKADE_STATE_DIR", b_state)
        return sandbox(argv, where)

    assert as_b([git, "init", "-q", "."], workspace).exit_code == 0
    subprocess.run([git, "init", "-q", str(other)], check=True)  # (C's home: not made yet)
    b_home = home_for(os.path.realpath(workspace), str(keys))
    before = snapshot(b_home)
    # (the place beside a state directory is home_for's with that directory)
    places = [home_for(os.path.realpath(w), place) for w in (workspace, other)
              for place in (b_state, str(keys))]
    monkeypatch.delenv("STOCKADE_STATE_DIR")
    r = sandbox([PYTHON, "-c", PLANT, *places], host_home, deny=())
    assert r.exit_code == 0, r.stderr.decode()
    outcomes = r.stdout.decode().splitlines()
    assert len(outcomes) == 4 and "DONE" not in outcomes[1::2], outcomes  # (the masked ones)
    for where in (workspace, other):
        r = as_b([git, "status", "--short"], where)
        assert r.exit_code == 0, r.stderr.decode()
        assert not (where / "PLANTED").exists(), where
    assert snapshot(b_home) == before


def test_no_private_home_without_a_place_the_password_database_names(ws, monkeypatch):
    """A uid the password database names no home for has no seal key's directory, so no
    place for private homes that no launch's environment decides: refused, typed (never a
    place beside the state directory the environment names, H2's)."""
    workspace, _ = ws
    monkeypatch.setattr(statedir, "key_dir", lambda: "")
    with pytest.raises(stockade.UnenforceableError) as refused:
        sandbox(["true"], workspace)
    assert refused.value.code == "unenforceable:filesystem.home"
    assert sandbox(["true"], workspace, home="host").exit_code == 0


def test_reconcile_removes_the_homes_of_workspaces_that_are_gone(ws, tmp_path, monkeypatch,
                                                                 capsys):
    """Issue 32: private homes of scratch workspaces piled up (about 140 in the root's place
    on this machine); `stockade reconcile` removes those whose recorded workspace is gone,
    with what a command left read-only in them, and keeps the others and any home made before
    workspaces were recorded."""
    import json

    from stockade.cli import main
    from stockade.lifecycle import homes

    workspace, _ = ws
    keys = tmp_path / "keys"
    monkeypatch.setattr(statedir, "key_dir", lambda: str(keys))
    gone = tmp_path / "scratch"
    gone.mkdir()
    r = sandbox(["sh", "-c", 'mkdir -p "$HOME/ro/in" && touch "$HOME/ro/in/f" && '
                 'chmod 555 "$HOME/ro/in" "$HOME/ro"'], gone)
    assert r.exit_code == 0, r.stderr
    assert sandbox(["true"], workspace).exit_code == 0
    old = homes.home_for("/an/older/workspace", str(keys))
    homes.ensure(old)  # (no workspace recorded)
    made = {w: home_for(os.path.realpath(w), str(keys)) for w in (gone, workspace)}
    assert all(os.path.isdir(h) for h in made.values())
    shutil.rmtree(gone)
    assert main(["reconcile", "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["homes_removed"]
    assert removed == [made[gone]]
    assert not os.path.lexists(made[gone])
    assert os.path.isdir(made[workspace]) and os.path.isdir(old)
    assert main(["reconcile", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["homes_removed"] == []


def test_reconcile_keeps_the_home_of_a_workspace_it_cannot_look_up(tmp_path, monkeypatch,
                                                                    capsys):
    """Issue 29 P1: a workspace that exists but cannot be looked up at that moment (a
    directory on its way unsearchable, as a locked home or a disk not mounted is; a link loop
    on its way, which stops root too) is not gone: its home stays. Only a plain "does not
    exist" removes one. Failed before (rootless): the home of the locked workspace removed."""
    import json

    from stockade.cli import main
    from stockade.lifecycle import homes

    keys = tmp_path / "keys"
    monkeypatch.setattr(statedir, "key_dir", lambda: str(keys))
    locked = tmp_path / "locked"
    (locked / "ws").mkdir(parents=True)
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "file").write_text("")
    kept = [str(locked / "ws"), str(tmp_path / "loop" / "ws")]
    gone = [str(tmp_path / "gone"), str(tmp_path / "file" / "ws")]
    made = {w: homes.home_for(w, str(keys)) for w in kept + gone}
    for workspace, home in made.items():
        homes.ensure(home, workspace)
    locked.chmod(0)
    try:
        assert main(["reconcile", "--json"]) == 0
    finally:
        locked.chmod(0o700)
    removed = json.loads(capsys.readouterr().out)["homes_removed"]
    assert sorted(removed) == sorted(made[w] for w in gone)
    assert all(os.path.isdir(made[w]) for w in kept)


def test_launches_at_once_make_one_home_and_keep_it(tmp_path):
    """Launches of one workspace at once make its home once: each used to take the other's,
    made but not yet recorded, for a planted one and remove it (a launch then ran in a home
    that was gone, or failed `filesystem.home`)."""
    import threading

    from stockade.errors import UnenforceableError
    from stockade.lifecycle import homes

    failures: list[str] = []
    for attempt in range(5):
        home = homes.home_for(str(tmp_path / f"ws{attempt}"), str(tmp_path / "keys"))
        start = threading.Barrier(6)
        seen: list[int] = []

        def ensure(home=home, start=start, seen=seen) -> None:
            start.wait()
            try:
                homes.ensure(home, "ws")
                seen.append(os.lstat(home).st_ino)
            except (UnenforceableError, OSError) as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=ensure) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert len(set(seen)) == 1 and seen[0] == os.lstat(home).st_ino
