"""The command's home (`filesystem.home`): under the writable presets it is a directory of the
sandbox's own, one per workspace, kept between runs (stockade/lifecycle/homes.py). Real npm,
pip and git write their caches and global configuration there, the next run of the same
workspace finds them, another workspace does not, and the host's home is never written."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import sandbox, unavailable
from test_linux_fs import snapshot

import stockade
from stockade.lifecycle.homes import home_for

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
    assert home == home_for(os.path.realpath(workspace), os.environ["STOCKADE_STATE_DIR"])
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
    assert not os.path.exists(home_for(os.path.realpath(workspace),
                                       os.environ["STOCKADE_STATE_DIR"]))


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
    state = os.environ["STOCKADE_STATE_DIR"]
    home = home_for(os.path.realpath(workspace), state)
    assert os.path.isfile(os.path.join(home, "ro", "in", "f"))
    homes.discard(str(workspace), state)
    assert not os.path.lexists(home)
