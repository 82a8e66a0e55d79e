"""A denied path is denied under every name a command could reach it by (issue 29, attack 7):
in each home of the user, when $HOME is not the home the password database names (sudo -E, a
CI runner, a tool that sets HOME: dn4), and at each other path a root shows it at, a bind
mount of the home or of the denied path itself (dn5), in both isolations. Real children; every
check of what happened is made on the host."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ATTEMPT, PYTHON, PYTHON_ROOT, policy_for

import stockade
from stockade.lifecycle import statedir

pytestmark = pytest.mark.usefixtures("linux")

SECRET = "deny-every-name-SECRET\n"
# One line per path: `path: DONE` (read) or `path: ERRNO`.
READ = ATTEMPT + """
import sys
for path in sys.argv[1:]:
    attempt(path, lambda: open(path).read())
"""


def lines(result: stockade.Result) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in result.stdout.decode().splitlines())


@pytest.fixture(params=["namespaces", "landlock"])
def isolation(request) -> str:
    return request.param


def real_home(tmp_path: Path) -> Path:
    """A home holding a key in .ssh (denied by every preset) and a note (not denied)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "id_test").write_text(SECRET)
    (home / "notes").write_text("everyday\n")
    return home


def pretend_passwd_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The password database names `home` (and the seal key's place, which it would hold
    rootless, a sibling: no root holds a state directory, which the landlock tier refuses)."""
    monkeypatch.setattr(statedir, "passwd_home", lambda uid=None: str(home))
    monkeypatch.setattr(statedir, "key_dir", lambda: str(home.parent / "keys" / "stockade"))


def test_the_password_databases_home_is_denied_whatever_home_says(tmp_path, monkeypatch,
                                                                   isolation):
    """dn4: HOME names another directory than the password database's home; the read-only
    preset's workspace is the password database's home. Its ~/.ssh stays masked (failed
    before: the key was read, the deny defaults' {home} being $HOME only), the rest of the
    home is read, and the key is unchanged."""
    home = real_home(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    pretend_passwd_home(home, monkeypatch)
    monkeypatch.setenv("HOME", str(other))
    policy = replace(policy_for("read-only"), isolation=isolation)
    r = stockade.run([PYTHON, "-c", READ, ".ssh/id_test", "notes"], policy, workspace=home)
    assert r.exit_code == 0, r.stderr
    assert lines(r) == {".ssh/id_test": "EACCES", "notes": "DONE"}, r.stdout
    assert (home / ".ssh" / "id_test").read_text() == SECRET


def test_a_missing_store_of_the_password_databases_home_in_a_write_root_is_refused(
        tmp_path, monkeypatch):
    """dn4: the same with the home as a write root and no ~/.aws there: the command could make
    it, so the launch is refused as it is when HOME names that home (failed before: it ran)."""
    home = real_home(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    pretend_passwd_home(home, monkeypatch)
    monkeypatch.setenv("HOME", str(other))
    with pytest.raises(stockade.UnenforceableError) as refused:
        stockade.run([PYTHON, "-c", "pass"], policy_for(home="host"), workspace=home)
    assert refused.value.code == "unenforceable:filesystem.deny"
    assert f"{home}/.aws" in refused.value.message
    assert not (home / ".aws").exists()


# In a private mount namespace (the mounts are seen by nothing else): a home bound at a second
# path and its .ssh at a third, a key file of it bound into a read root; one run per case,
# reading the key by each name, its .ssh denied (by path: HOME stays the host's, whose state
# directory the landlock tier refuses in a root); what each run did, as JSON.
CHILD = """
import json, os, subprocess, sys
from dataclasses import replace
import stockade
from stockade.policy import preset
home, alias, keys, other, isolation, read = sys.argv[1:7]
subprocess.run(["mount", "--bind", home, alias], check=True)
subprocess.run(["mount", "--bind", home + "/.ssh", keys], check=True)
subprocess.run(["mount", "--bind", home + "/.ssh/id_test", other + "/key"], check=True)
found = {}
for case, workspace, roots in (("alias as workspace", alias, []),
                               ("alias as a read root", other, [alias]),
                               ("the keys as a read root", other, [keys]),
                               ("a directory of the keys as a read root", other,
                                [keys + "/sub"])):
    base = preset("read-only")
    fs = replace(base.filesystem, read=base.filesystem.read + tuple(json.loads(read) + roots),
                 deny=base.filesystem.deny + (home + "/.ssh",))
    names = [alias + "/.ssh/id_test", alias + "/notes"] + (
        [other + "/key", other + "/notes"] if workspace == other else [])
    try:
        r = stockade.run([sys.executable, "-c", sys.argv[7], *names],
                         replace(base, filesystem=fs, isolation=isolation),
                         workspace=workspace, text=True)
        found[case] = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    except stockade.StockadeError as exc:
        found[case] = exc.code
print(json.dumps(found))
"""


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
def test_a_denied_path_is_masked_at_every_name_a_bind_mount_gives_it(tmp_path, isolation):
    """dn5: a home bound at a second path, that path the workspace or a read root, and
    a key file of its .ssh bound into the workspace: the key is masked at each name (failed
    before: read at every one), the home's other files are read, and a read root that is
    .ssh, or a directory of it, under another path is refused, typed, as .ssh itself would
    be."""
    home = real_home(tmp_path)
    (home / ".ssh" / "sub").mkdir()
    alias, keys, other = tmp_path / "alias", tmp_path / "keys", tmp_path / "other"
    for directory in (alias, keys, other):
        directory.mkdir()
    (other / "key").touch()
    (other / "notes").write_text("everyday\n")
    read = [] if PYTHON_ROOT.startswith("/usr") else [PYTHON_ROOT]
    # (the package these tests import: a mutant's copy's, scripts/mutants.py)
    env = {**os.environ, "PYTHONPATH": str(Path(stockade.__file__).parent.parent)}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", PYTHON, "-c", CHILD,
                           str(home), str(alias), str(keys), str(other), isolation,
                           json.dumps(read), READ], capture_output=True, text=True,
                          timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    key, note = f"{alias}/.ssh/id_test", f"{alias}/notes"
    assert found["alias as workspace"] == {key: "EACCES", note: "DONE"}, found
    assert found["alias as a read root"] == {key: "EACCES", note: "DONE",
                                             f"{other}/key": "EACCES",
                                             f"{other}/notes": "DONE"}, found
    assert found["the keys as a read root"] == "policy_invalid", found
    assert found["a directory of the keys as a read root"] == "policy_invalid", found
    assert (home / ".ssh" / "id_test").read_text() == SECRET
    assert not os.listdir(alias) and not os.listdir(keys)  # (the mounts were the child's own)


# The host's secrets in /etc the presets deny (dn1), one canary each where a host keeps one.
ETC_SECRETS = ("wireguard/wg0.conf", "NetworkManager/system-connections/home.nmconnection",
               "wpa_supplicant/wpa_supplicant.conf", "netplan/50-wifi.yaml",
               "openvpn/client/vpn.key", "ipsec.secrets", "ipsec.d/private/host.pem",
               "swanctl/private/host.pem", "strongswan/ipsec.secrets", "ppp/chap-secrets",
               "ppp/pap-secrets", "kubernetes/admin.conf", "kubernetes/pki/ca.key",
               "rancher/k3s/k3s.yaml", "mysql/debian.cnf", "mysql/conf.d/backup.cnf",
               "pki/tls/private/host.key", "pki/CA/private/ca.key",
               "letsencrypt/live/example.org/privkey.pem", "krb5.keytab", "sssd/sssd.conf",
               "libvirt/secrets/0.base64",
               # (attack 8, dl4)
               "postfix/sasl_passwd", "ldap.secret", "pam_ldap.secret", "credstore/db.cred",
               "ceph/ceph.client.admin.keyring", "dkimkeys/mail.private", "rsyncd.secrets",
               "chrony/chrony.keys", "bind/rndc.key", "davfs2/secrets", "msmtprc",
               "exim4/passwd.client", "iscsi/iscsid.conf")

# In a private mount namespace: /etc overlaid with a canary (mode 0600) at each of those
# places, seen by nothing else; a run of a preset reading each (`/etc/NAME: DONE` or ERRNO).
ETC_CHILD = """
import os, subprocess, sys
from dataclasses import replace
import stockade
from stockade.policy import preset
upper, work, isolation, script, *names = sys.argv[1:]
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir=/etc,upperdir={upper},workdir={work}", "/etc"], check=True)
r = stockade.run([sys.executable, "-c", script, *("/etc/" + name for name in names)],
                 replace(preset("workspace-write"), isolation=isolation), workspace=os.getcwd())
sys.stdout.write(r.stdout.decode())
"""


@pytest.mark.root_only("an overlay on /etc in a mount namespace of the test's own needs root; "
                       "the files are root's own, which a rootless sandbox cannot read anyway")
def test_the_hosts_secrets_in_etc_are_denied_to_root(ws, tmp_path, isolation):
    """dn1: root in a sandbox reads what root reads; the presets deny the private keys and
    passwords a host keeps in /etc (VPNs, Wi-Fi, cluster admin credentials, MySQL's service
    account, TLS keys). Each canary is unreadable (failed before: all but none read), and
    /etc's other files are read."""
    workspace, _ = ws
    upper, work = tmp_path / "upper", tmp_path / "work"
    work.mkdir()
    for name in ETC_SECRETS:
        (upper / name).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        (upper / name).write_text(SECRET)
        (upper / name).chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(Path(stockade.__file__).parent.parent)}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", PYTHON, "-c",
                           ETC_CHILD, str(upper), str(work), isolation, READ, *ETC_SECRETS,
                           "hostname" if os.path.exists("/etc/hostname") else "passwd"],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=workspace)
    assert done.returncode == 0, done.stderr
    found = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert found.pop("/etc/hostname", found.pop("/etc/passwd", None)) == "DONE", found
    assert found == {f"/etc/{name}": "EACCES" for name in ETC_SECRETS}, found


def test_a_missing_default_costs_no_mask_and_refuses_nothing(ws):
    """dn1: a default denied path the host does not have is no mask and no refusal: on this
    host (which has none of VPN, cluster or database secrets, say) every preset compiles,
    with only what exists to mask."""
    from stockade.launch.compile import CompileContext, compile_policy
    from stockade.policy.presets import PRESET_DOCUMENTS

    workspace, _ = ws
    for name in PRESET_DOCUMENTS:
        request = compile_policy(stockade.preset(name), ["true"],
                                 CompileContext.current(workspace))
        assert all(os.path.lexists(grant.path) for grant in request.deny), name


def test_the_missing_denied_paths_remedy_makes_files_as_files_with_their_directories(tmp_path):
    """Attack 8, dl5: with /etc as the workspace the remedy made `sudoers` a directory (sudo
    then fails) and stopped at `touch ppp/chap-secrets` (touch makes no directory). Run as
    printed, it now makes each file a file, its directory first, and the rest directories."""
    from stockade.launch import compile as compiler
    from stockade.launch.compile import CompileContext
    from stockade.launch.request import PathGrant

    etc = tmp_path / "etc"
    etc.mkdir()
    ctx = CompileContext(workspace=str(etc), home=str(tmp_path), tmp=None, host_env={})
    wanted = ("{workspace}/sudoers", "{workspace}/ppp/chap-secrets", "{workspace}/shadow",
              "{workspace}/davfs2/secrets", "{workspace}/libvirt/secrets", "{workspace}/ssh")
    with pytest.raises(stockade.UnenforceableError) as refused:
        compiler._denied(wanted, ctx, (PathGrant(str(etc), str(etc)),))
    command = refused.value.message.split(", with ", 1)[1].split(", or choose", 1)[0]
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    for name in ("sudoers", "ppp/chap-secrets", "shadow", "davfs2/secrets"):
        assert (etc / name).is_file(), name
    for name in ("libvirt/secrets", "ssh"):
        assert (etc / name).is_dir(), name


@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_denied_path_this_user_may_not_look_up_in_a_write_root_is_refused_as_such(
        ws, isolation):
    """Attack 9, dl9i: a denied file below a directory of the user's that may be listed but
    not searched (0644) in the write root was refused as missing, with a remedy (mkdir, touch)
    that fails there. Rootless it is refused as unknown, naming the directory and the chmod
    that lets the launch look; as root the lookup succeeds and the file is masked."""
    workspace, _ = ws
    secret = workspace / "d" / "prod.env"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    (workspace / "d").chmod(0o644)
    policy = replace(policy_for(deny=(str(secret),), pids=None), isolation=isolation)
    try:
        if os.getuid() != 0:
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run([PYTHON, "-c", READ, "d/prod.env"], policy, workspace=workspace)
            assert refused.value.code == "unenforceable:filesystem.deny"
            assert "may not look up" in refused.value.message, refused.value.message
            assert f"chmod u+x {workspace}/d," in refused.value.message
            assert "do not exist" not in refused.value.message
            return
        r = stockade.run([PYTHON, "-c", READ, "d/prod.env"], policy, workspace=workspace)
        assert SECRET not in r.stdout.decode(), r.stdout
    finally:
        (workspace / "d").chmod(0o755)
    assert secret.read_text() == SECRET


CHMOD_THEN_READ = ATTEMPT + """
import os, sys
attempt("chmod", lambda: os.chmod(sys.argv[1], 0o755))
attempt(sys.argv[2], lambda: open(sys.argv[2]).read())
"""


@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_denied_path_below_a_directory_of_the_users_it_may_not_search_in_a_read_root(
        ws, isolation):
    """Attack 11, dl9i-readroot: a denied file below a directory of the user's, in a read root,
    that it may list but not search (0644): the launch cannot look the file up, so nothing was
    carved for it, and in the landlock tier (Landlock does not govern chmod) the command made
    the directory searchable and read it. There it is refused, typed, naming the directory; a
    view's read roots are read-only mounts, where the chmod fails."""
    workspace, outside = ws
    secret = outside / "d" / "prod.env"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    (outside / "d").chmod(0o644)
    policy = replace(policy_for(deny=(str(secret),), read=(str(outside),), pids=None),
                     isolation=isolation)
    args = [PYTHON, "-c", CHMOD_THEN_READ, str(outside / "d"), str(secret)]
    try:
        if os.getuid() != 0 and isolation == "landlock":
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run(args, policy, workspace=workspace)
            assert refused.value.code == "unenforceable:filesystem.deny"
            assert f"{secret} (in the read root {outside})" in refused.value.message
            assert f"chmod u+x {outside}/d," in refused.value.message
            return
        r = stockade.run(args, policy, workspace=workspace)
        assert SECRET not in r.stdout.decode() + r.stderr.decode(), r.stdout
        assert f"{secret}: DONE" not in r.stdout.decode(), r.stdout
    finally:
        (outside / "d").chmod(0o755)
    assert secret.read_text() == SECRET


@pytest.mark.root_only("needs a link of another user's, which only root can make (scripts/test.sh "
                       "gives its rootless pass one: STOCKADE_TEST_ROOT_LINK)",
                       unless_env="STOCKADE_TEST_ROOT_LINK")
@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_denied_path_named_through_another_users_link_to_the_users_own_directory(
        ws, tmp_path, isolation):
    """Attack 12, D3 symlink: the denied path named through a link of root's (a /home ->
    var/home kind) to a directory of the user's in a read root that the launch may not search:
    the link's owner was taken for the directory's, the path passed over as another user's,
    and in the landlock tier the command made its directory searchable and read the file. The
    directory is judged, not the link: refused there, typed; a view's read root is read-only."""
    link = os.environ.get("STOCKADE_TEST_ROOT_LINK")
    if link is None:  # (root: its own)
        link = str(tmp_path / "link")
        os.symlink("dir/linked", link)
        (tmp_path / "dir").mkdir()
    mine = Path(os.path.dirname(link)) / os.readlink(link)
    mine.mkdir()
    secret = mine / "prod.env"
    secret.write_text(SECRET)
    mine.chmod(0o644)
    policy = replace(policy_for(deny=(f"{link}/prod.env",), read=(str(mine),), pids=None),
                     isolation=isolation)
    args = [PYTHON, "-c", CHMOD_THEN_READ, str(mine), str(secret)]
    try:
        if os.getuid() != 0 and isolation == "landlock":
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run(args, policy, workspace=ws[0])
            assert refused.value.code == "unenforceable:filesystem.deny"
            assert f"chmod u+x {mine}," in refused.value.message, refused.value.message
        else:
            r = stockade.run(args, policy, workspace=ws[0])
            assert SECRET not in r.stdout.decode() + r.stderr.decode(), r.stdout
            assert f"{secret}: DONE" not in r.stdout.decode(), r.stdout
    finally:
        mine.chmod(0o755)
        secret.unlink()
        mine.rmdir()


# (root makes them: scripts/test.sh for its rootless pass, unsearched_bind() as root)
UNSEARCHED = pytest.mark.root_only(
    "needs another user's directory and bind mounts, which only root can make (scripts/test.sh "
    "gives its rootless pass them: STOCKADE_TEST_UNSEARCHED)",
    unless_env="STOCKADE_TEST_UNSEARCHED")


def unsearched_bind(tmp_path: Path) -> Path:
    """What scripts/test.sh makes for its rootless pass (STOCKADE_TEST_UNSEARCHED), made here
    as root: nob/ another user's, not searchable, nob/keys/id in it, nob/keys bound at ro/view."""
    top = tmp_path / "unsearched"
    (top / "nob" / "keys").mkdir(parents=True)
    (top / "nob" / "keys" / "id").write_text("unsearched-bind-secret\n")
    for path, mode in ((top, 0o755), (top / "nob", 0o700), (top / "nob" / "keys", 0o755),
                       (top / "nob" / "keys" / "id", 0o644)):
        os.chown(path, 65534, 65534)
        path.chmod(mode)
    tmp_path.chmod(0o755)
    (top / "ro" / "view").mkdir(parents=True)
    (top / "mine" / "m").mkdir(parents=True)
    (top / "nob" / "inner").mkdir()
    for point in ("ro/view", "mine/m", "nob/inner"):
        subprocess.run(["mount", "--bind", top / "nob" / "keys", top / point], check=True)
    return top


@UNSEARCHED
@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_denied_path_below_another_users_directory_is_denied_where_a_mount_shows_it(
        ws, tmp_path, isolation):
    """Attack 12, D3 bind: a denied file below a directory of another user's that this user
    may not search is passed over (nor can the command reach it there), and so were the names a
    mount gives it in a read root, where the command read it. Each name the mount table gives
    such a path in a root is denied, unverified (nothing there can be looked up to compare)."""
    workspace, _ = ws
    given = os.environ.get("STOCKADE_TEST_UNSEARCHED")
    top = Path(given) if given else unsearched_bind(tmp_path)
    try:
        policy = replace(policy_for(deny=(f"{top}/nob/keys/id",), read=(f"{top}/ro",),
                                    pids=None), isolation=isolation)
        r = stockade.run([PYTHON, "-c", READ, f"{top}/ro/view/id"], policy, workspace=workspace)
        assert "unsearched-bind-secret" not in r.stdout.decode() + r.stderr.decode(), r.stdout
        assert f"{top}/ro/view/id: DONE" not in r.stdout.decode(), r.stdout
    finally:
        if not given:
            unbind(top)


def unbind(top: Path) -> None:
    subprocess.run(["umount", "-l", top / "ro" / "view", top / "mine" / "m",
                    top / "nob" / "inner"], check=True)


@UNSEARCHED
@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_mount_below_a_directory_this_user_may_not_search_in_a_read_root_is_refused(
        ws, tmp_path, isolation):
    """Attack 16, M1: a denied directory bound below a directory of the user's that it may not
    search (mode 000), in a read root: the name could not be looked up to compare, and was
    dropped; in the landlock tier (Landlock does not govern chmod) the command made the
    directory searchable and read the denied files. A mount in a root this user cannot look at
    refuses the launch, typed, naming it; as root it is looked at, and masked."""
    workspace, _ = ws
    given = os.environ.get("STOCKADE_TEST_UNSEARCHED")
    top = Path(given) if given else unsearched_bind(tmp_path)
    (top / "mine").chmod(0)  # (while this test runs only: see scripts/test.sh)
    try:
        policy = replace(policy_for(deny=(f"{top}/nob/keys",), read=(f"{top}/mine",),
                                    pids=None), isolation=isolation)
        args = [PYTHON, "-c", CHMOD_THEN_READ, f"{top}/mine", f"{top}/mine/m/id"]
        if os.getuid() != 0:
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run(args, policy, workspace=workspace)
            assert refused.value.code == "unenforceable:filesystem.read"
            assert f"{top}/mine/m, where a mount shows part of a root, cannot be looked " \
                   "at by this user" in refused.value.message, refused.value.message
            return
        r = stockade.run(args, policy, workspace=workspace)
        assert "unsearched-bind-secret" not in r.stdout.decode() + r.stderr.decode(), r.stdout
    finally:
        (top / "mine").chmod(0o755)
        if not given:
            unbind(top)


@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_denied_path_reached_through_a_link_in_a_write_root_is_refused(ws, isolation):
    """Attack 15, D1: the denied path a link in the workspace (a/secret -> ../b/real): the
    launch denied what the link pointed to; the command pointed the link at a directory of its
    own, and the next launch denied that instead, the secret in the clear. Refused, typed,
    naming the link and what to deny instead."""
    workspace, _ = ws
    (workspace / "b" / "real").mkdir(parents=True)
    (workspace / "b" / "real" / "id").write_text(SECRET)
    (workspace / "a").mkdir()
    (workspace / "a" / "secret").symlink_to("../b/real")
    policy = replace(policy_for(deny=(str(workspace / "a" / "secret"),), pids=None),
                     isolation=isolation)
    with pytest.raises(stockade.UnenforceableError) as refused:
        stockade.run([PYTHON, "-c", READ, "b/real/id"], policy, workspace=workspace)
    assert refused.value.code == "unenforceable:filesystem.symlink"
    assert f"symbolic link {workspace}/a/secret, inside the write root {workspace}" \
        in refused.value.message, refused.value.message
    assert f"deny the path it points to ({workspace}/b/real)" in refused.value.message


@UNSEARCHED
@pytest.mark.parametrize("isolation", ["namespaces", "landlock"])
def test_a_mount_below_another_users_directory_in_a_read_root_refuses_nothing(
        ws, tmp_path, isolation):
    """Attack 17, F1: a mount below a directory of another user's this user may not search
    (a desktop's /run/user/<uid>/doc, gvfs) in a read root refused every rootless launch that
    read /run or /: a mount nothing can look at was refused whoever's directory hid it. Out of
    the command's reach too, it is passed over; the launch runs."""
    workspace, _ = ws
    given = os.environ.get("STOCKADE_TEST_UNSEARCHED")
    top = Path(given) if given else unsearched_bind(tmp_path)
    try:
        policy = replace(policy_for(read=(f"{top}/nob",), pids=None), isolation=isolation)
        r = stockade.run([PYTHON, "-c", "print('RAN')"], policy, workspace=workspace)
        assert r.exit_code == 0 and r.stdout.decode() == "RAN\n", r.stderr
    finally:
        if not given:
            unbind(top)
