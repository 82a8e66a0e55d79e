"""A denied file is denied under every name (issue 29, attack 7 dn2, dn3, dn6): a hard link made on
the host before the launch is another name for the same inode, which a mask on the denied path
does not cover, and a Landlock rule given to it holds for the denied path too (rules attach to
inodes). Another name in a write root is masked as the denied path is (and in the landlock tier
carved out as it is); one in a read root, found by looking through them, refuses it, and one
outside every root shows nothing. Real children, both isolations; every check of what happened is
made on the host."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import PYTHON, policy_for

import stockade

pytestmark = pytest.mark.usefixtures("linux")

SECRET = "DENYLINK-CANARY"
ISOLATIONS = ["namespaces", "landlock"]
# Read each name given, then try to rename each directory above the names (a mask must stay).
READ_ALL = """
import errno, os, sys
for name in sys.argv[1:]:
    try:
        print("READ", name, open(name).read())
    except OSError as exc:
        print("UNREAD", name, errno.errorcode[exc.errno])
for name in sys.argv[1:]:
    parent = os.path.dirname(name)
    if parent and os.path.isdir(parent):
        try:
            os.rename(parent, parent + "-moved")
            print("MOVED", parent)
        except OSError as exc:
            print("KEPT", parent, errno.errorcode[exc.errno])
"""


def run(workspace, names: list[str], isolation: str, deny: tuple[str, ...],
        read: tuple[str, ...] = ()) -> stockade.Result:
    # (pids=None: the landlock tier refuses a pids limit as root, which RLIMIT_NPROC cannot bind)
    policy = replace(policy_for(deny=deny, read=read, pids=None), isolation=isolation)
    return stockade.run([PYTHON, "-c", READ_ALL, *names], policy, workspace=workspace)


def secret_at(path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SECRET)
    return str(path)


def linked_secret(workspace) -> None:
    """The denied file secrets/prod.env, and a hard link of it at other/copy.env."""
    (workspace / "other").mkdir()
    os.link(secret_at(workspace / "secrets" / "prod.env"), workspace / "other" / "copy.env")


def listing(top) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), top)
                  for d, dirs, files in os.walk(top) for n in dirs + files)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_hard_link_of_a_denied_file_in_a_write_root_is_denied_too(ws, isolation):
    """dn2/dn6: `ln secrets/prod.env other/copy.env` on the host before the launch. Neither
    name shows the secret (in the landlock tier the link's rule made the denied path itself
    readable), and the directory above the link is pinned as the denied path's is."""
    workspace, _ = ws
    denied = secret_at(workspace / "secrets" / "prod.env")
    os.makedirs(workspace / "other" / "deep")
    os.link(denied, workspace / "other" / "deep" / "copy.env")
    before = listing(workspace)
    r = run(workspace, ["secrets/prod.env", "other/deep/copy.env"], isolation, (denied,))
    assert r.exit_code == 0, r.stderr
    out = r.stdout.decode()
    assert SECRET not in out + r.stderr.decode()
    assert "UNREAD secrets/prod.env" in out and "UNREAD other/deep/copy.env" in out, out
    assert "MOVED" not in out, out
    assert listing(workspace) == before
    assert os.stat(denied).st_nlink == 2
    assert open(workspace / "other" / "deep" / "copy.env").read() == SECRET


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_file_of_a_denied_directory_linked_into_a_write_root_is_denied_too(ws, isolation):
    """dn3's shape in a write root: the key in a denied directory, a backup of it by hard link
    elsewhere in the workspace."""
    workspace, _ = ws
    secret_at(workspace / "dotssh" / "id_key")
    (workspace / "backup").mkdir()
    os.link(workspace / "dotssh" / "id_key", workspace / "backup" / "id_key.bak")
    r = run(workspace, ["backup/id_key.bak"], isolation, (str(workspace / "dotssh"),))
    assert r.exit_code == 0, r.stderr
    assert SECRET not in r.stdout.decode() + r.stderr.decode()
    assert "UNREAD backup/id_key.bak" in r.stdout.decode(), r.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_denied_file_linked_into_a_read_root_refuses_the_launch(ws, isolation):
    """dn3: a name in a read root cannot be masked there (a read root is not the write roots'
    walk's): the read roots are looked through for it, and the launch is refused, typed,
    naming the file, its link count, the name found, its root and the remedy, before anything
    runs."""
    workspace, outside = ws
    denied = secret_at(workspace / "dotssh" / "id_key")
    (outside / "old").mkdir()
    os.link(denied, outside / "old" / "id_key.bak")
    for deny in ((denied,), (str(workspace / "dotssh"),)):
        with pytest.raises(stockade.UnenforceableError) as refused:
            run(workspace, [str(outside / "old" / "id_key.bak")], isolation, deny,
                read=(str(outside),))
        assert refused.value.code == "unenforceable:filesystem.deny"
        assert denied in refused.value.message and "2 hard links" in refused.value.message
        assert f"{outside}/old/id_key.bak shows it in the read root {outside}" \
            in refused.value.message, refused.value.message
        assert "deny that name" in refused.value.message and "remove" in refused.value.message
    assert listing(outside) == ["old", "old/id_key.bak"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_denied_file_linked_outside_every_root_is_no_refusal(ws, isolation):
    """dn3, no false refusal: the denied file's other name lies outside every root (a backup
    the sandbox never sees), so looking through the read roots finds nothing and the launch
    runs. The command reads neither name, and nothing outside changed."""
    workspace, outside = ws
    denied = secret_at(workspace / "dotssh" / "id_key")
    os.link(denied, outside / "id_key.bak")
    before = listing(workspace)
    for deny in ((denied,), (str(workspace / "dotssh"),)):
        r = run(workspace, ["dotssh/id_key", str(outside / "id_key.bak")], isolation, deny)
        assert r.exit_code == 0, r.stderr
        out = r.stdout.decode()
        assert SECRET not in out + r.stderr.decode()
        assert "UNREAD dotssh/id_key" in out and f"UNREAD {outside}/id_key.bak" in out, out
        assert "MOVED" not in out, out
    assert listing(workspace) == before and listing(outside) == ["id_key.bak"]
    assert os.stat(denied).st_nlink == 2 and open(outside / "id_key.bak").read() == SECRET


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_read_root_the_launch_cannot_look_through_keeps_the_refusal(ws, isolation):
    """dn3: the other name lies in a directory of the user's own in a read root, mode 0 (the
    landlock tier's command may chmod it back: Landlock does not govern chmod). Where the launch
    cannot list it (rootless, without a user namespace's mapped root: the landlock tier) nothing
    tells where that name lies, and the launch is refused as before, typed, with the remedy;
    elsewhere the directory is listed and the name found, and the refusal names it."""
    workspace, outside = ws
    denied = secret_at(workspace / "dotssh" / "id_key")
    (outside / "shut").mkdir()
    os.link(denied, outside / "shut" / "id_key.bak")
    (outside / "shut").chmod(0)
    try:
        with pytest.raises(stockade.UnenforceableError) as refused:
            run(workspace, [str(outside / "shut" / "id_key.bak")], isolation, (denied,),
                read=(str(outside),))
    finally:
        (outside / "shut").chmod(0o755)
    message = refused.value.message
    assert refused.value.code == "unenforceable:filesystem.deny"
    if os.getuid() != 0 and isolation == "landlock":
        assert f"{outside}/shut there cannot be read whole" in message, message
        assert f"find / -xdev -samefile {denied}" in message, message
    else:
        assert f"{outside}/shut/id_key.bak shows it in the read root" in message, message
    assert listing(outside) == ["shut", "shut/id_key.bak"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_links_that_are_all_denied_need_no_refusal(ws, isolation):
    """No false refusal: every name of a multiply-linked file lies inside what is denied (two
    names in a denied directory, or each name denied itself)."""
    workspace, outside = ws
    key = secret_at(workspace / "dotssh" / "id_key")
    os.link(key, workspace / "dotssh" / "id_key.old")
    token = secret_at(outside / "token")
    os.link(token, outside / "token.bak")
    r = run(workspace, ["dotssh/id_key", str(outside / "token.bak")], isolation,
            (str(workspace / "dotssh"), token, str(outside / "token.bak")), read=(str(outside),))
    assert r.exit_code == 0, r.stderr
    assert SECRET not in r.stdout.decode() + r.stderr.decode()
    assert r.stdout.decode().count("UNREAD") == 2, r.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_denied_directory_that_can_be_entered_but_not_listed_never_shows_its_files(
        ws, isolation):
    """Attack 8, dl1: the denied directory may be entered but not listed (mode 0311), its file
    hard-linked into the write root. The walk could not look inside, so the link was an
    ordinary file: read, and in the landlock tier its rule made the denied path itself
    readable. Now where the launch cannot list it (rootless, without a user namespace's
    mapped root: the landlock tier) it is refused, typed; elsewhere the link is masked."""
    workspace, _ = ws
    secret_at(workspace / "secrets" / "prod.env")
    (workspace / "other").mkdir()
    os.link(workspace / "secrets" / "prod.env", workspace / "other" / "copy.env")
    (workspace / "secrets").chmod(0o311)
    try:
        if os.getuid() != 0 and isolation == "landlock":
            with pytest.raises(stockade.UnenforceableError) as refused:
                run(workspace, ["other/copy.env"], isolation, (str(workspace / "secrets"),))
            assert refused.value.code == "unenforceable:filesystem.deny"
            assert "cannot be looked for" in refused.value.message
            return
        r = run(workspace, ["secrets/prod.env", "other/copy.env"], isolation,
                (str(workspace / "secrets"),))
    finally:
        (workspace / "secrets").chmod(0o755)
    assert r.exit_code == 0, r.stderr
    assert SECRET not in r.stdout.decode() + r.stderr.decode()
    assert "UNREAD other/copy.env" in r.stdout.decode(), r.stdout


# In a private mount namespace (seen by nothing else): a directory bound at a second path
# (argv: its source and target), then the launch, reading the names given; its outcome.
BOUND = """
import os, subprocess, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[5])
import stockade
from conftest import PYTHON, policy_for
workspace, outside, isolation, script, _, source, target, *names = sys.argv[1:]
# (steps before the names: `bind:SOURCE:POINT` first, `rm:PATH` once bound, then `late:SOURCE:
# POINT` a bind over, `beneath:SOURCE:POINT` one put beneath what is there; `write:PATH` a root)
kinds = ("bind", "rm", "late", "beneath", "write")
steps = [name for name in names if name.split(":")[0] in kinds]
names = [name for name in names if name not in steps]


def beneath(source, point):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(428, -100, os.fsencode(source), 1 | 0o2000000)  # open_tree: CLONE
    assert fd >= 0, ctypes.get_errno()
    # (move_mount: MOVE_MOUNT_T_SYMLINKS | MOVE_MOUNT_F_EMPTY_PATH ... BENEATH, Linux 6.5)
    assert libc.syscall(429, fd, b"", -100, os.fsencode(point), 0x4 | 0x200) == 0, \
        ctypes.get_errno()
    os.close(fd)


for step in steps:
    if step.startswith("bind:"):
        subprocess.run(["mount", "--bind", *step.split(":")[1:]], check=True)
subprocess.run(["mount", "--bind", source, target], check=True)
for step in steps:
    if step.startswith("rm:"):
        os.unlink(step[3:])
for step in steps:
    if step.startswith("late:"):
        subprocess.run(["mount", "--bind", *step.split(":")[1:]], check=True)
    elif step.startswith("beneath:"):
        beneath(*step.split(":")[1:])
write = tuple(step[6:] for step in steps if step.startswith("write:"))
policy = replace(policy_for(deny=(workspace + "/secrets/prod.env",), read=(outside,), pids=None,
                            **({"write": (workspace, *write)} if write else {})),
                 isolation=isolation)
try:
    r = stockade.run([PYTHON, "-c", script, *names], policy, workspace=workspace)
    print("EXIT", r.exit_code, r.stdout.decode(), r.stderr.decode())
except stockade.StockadeError as exc:
    print("REFUSED", exc.code, exc)
"""


def run_bound(workspace, outside, isolation: str, source, target, *names,
              script: str = READ_ALL) -> str:
    """BOUND's output, run in a private mount namespace."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(stockade.__file__))}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           BOUND, str(workspace), str(outside), isolation, script,
                           os.path.dirname(__file__), str(source), str(target),
                           *map(str, names)], capture_output=True, text=True, timeout=180,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert not os.path.isdir(target) or not os.listdir(target)  # (the child's own mount)
    return done.stdout


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_name_a_bind_mount_shows_twice_counts_once(ws, isolation):
    """Attack 8, dl2: a link in the write root seen at two paths (its directory bound at a
    second one) was counted as two names, so a third name in a read root went unrefused and
    showed the file. Names are counted by place (their directory's identity and the name)."""
    workspace, outside = ws
    denied = secret_at(workspace / "secrets" / "prod.env")
    (workspace / "other").mkdir()
    (workspace / "other2").mkdir()
    os.link(denied, workspace / "other" / "copy.env")
    os.link(denied, outside / "third.env")
    out = run_bound(workspace, outside, isolation, workspace / "other", workspace / "other2",
                    outside / "third.env")
    assert SECRET not in out
    assert "REFUSED unenforceable:filesystem.deny" in out, out


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_link_a_read_root_shows_through_a_bind_mount_is_denied_there_too(ws, isolation):
    """Attack 9, dl9c: the write root's directory holding a link of a denied file bound into a
    read root shows the link at a second path, which the walk of the write root never meets
    and the mask of the first name does not cover (a mount, and in the landlock tier a rule
    on the read root's inode, the same directory). Every path a mount shows a found name at
    in any root is denied too; the command reads neither."""
    workspace, outside = ws
    denied = secret_at(workspace / "secrets" / "prod.env")
    (workspace / "other").mkdir()
    (outside / "view").mkdir()
    os.link(denied, workspace / "other" / "copy.env")
    out = run_bound(workspace, outside, isolation, workspace / "other", outside / "view",
                    outside / "view" / "copy.env", "other/copy.env")
    assert SECRET not in out
    assert "EXIT 0" in out, out
    assert f"UNREAD {outside}/view/copy.env" in out and "UNREAD other/copy.env" in out, out


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_bind_of_a_link_since_removed_still_shows_nothing(ws, isolation):
    """Attack 11, dl9c-filebind_src_removed (and attack 13 E2/E3: a file of a denied or
    protected directory, or one below another user's directory): a link bound on a file of a
    read root, then the link removed: the file has one name again (no walk looks for
    others), and the mount table names the bind by the removed path ("//deleted"), so nothing
    tells what it shows. A root holding such a mount of what still has a name is refused,
    typed, naming it."""
    workspace, outside = ws
    linked_secret(workspace)
    (outside / "view.env").write_text("")
    out = run_bound(workspace, outside, isolation, workspace / "other" / "copy.env",
                    outside / "view.env", f"rm:{workspace}/other/copy.env",
                    outside / "view.env")
    assert SECRET not in out
    assert f"REFUSED unenforceable:filesystem.read unenforceable:filesystem.read: " \
           f"{outside}/view.env, in or above the root {outside}, is a mount of what a name " \
           "since removed named" in out, out
    assert (outside / "view.env").read_text() == ""


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_mount_of_a_removed_name_on_top_of_another_is_seen(ws, isolation):
    """Attack 14, R1: a decoy mounted beneath the bind of a removed link (move_mount's
    MOVE_MOUNT_BENEATH) is listed after it, and the last one listed at a point was taken for
    the one seen there: the check met the decoy, and the denied file was read. The one on top
    is the one no other at that point is mounted on."""
    workspace, outside = ws
    linked_secret(workspace)
    (outside / "view.env").write_text("")
    (outside / "decoy.env").write_text("decoy")
    out = run_bound(workspace, outside, isolation, workspace / "other" / "copy.env",
                    outside / "view.env", f"rm:{workspace}/other/copy.env",
                    f"beneath:{outside}/decoy.env:{outside}/view.env", outside / "view.env")
    assert SECRET not in out
    assert f"{outside}/view.env, in or above the root {outside}, is a mount of what a name " \
           "since removed named" in out, out


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_mount_of_a_removed_name_hidden_by_a_mount_above_it_refuses_nothing(ws, tmp_path,
                                                                                isolation):
    """Attack 14, R2: the bind of a removed link at sub/x, then a directory bound over sub
    (with an x of its own): the first cannot be reached, yet it refused the launch. A mount
    whose parent is not the mount its directory is seen on is hidden, and judged by nothing."""
    workspace, outside = ws
    linked_secret(workspace)
    (outside / "sub").mkdir()
    (outside / "sub" / "x").write_text("")
    cover = tmp_path / "cover"
    cover.mkdir()
    (cover / "x").write_text("cover")
    out = run_bound(workspace, outside, isolation, workspace / "other" / "copy.env",
                    outside / "sub" / "x", f"rm:{workspace}/other/copy.env",
                    f"late:{cover}:{outside}/sub", outside / "sub" / "x")
    assert SECRET not in out
    assert "EXIT 0" in out and f"READ {outside}/sub/x cover" in out, out


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_mount_beside_a_hidden_one_at_its_point_is_seen(ws, tmp_path, isolation):
    """Attack 15, N1: a decoy bound at sub/x, a directory bound over sub, and the bind of a
    removed link at sub/x on that: two mounts at one point, neither mounted on the other. The
    table's order was read as their stacking, the decoy taken for the one seen and found
    hidden, and with it the point: nothing judged what was seen there. The kernel is asked."""
    workspace, outside = ws
    linked_secret(workspace)
    (outside / "sub").mkdir()
    (outside / "sub" / "x").write_text("")
    (tmp_path / "decoy").write_text("decoy")
    cover = tmp_path / "cover"
    cover.mkdir()
    (cover / "x").write_text("cover")
    out = run_bound(workspace, outside, isolation, workspace / "other" / "copy.env",
                    outside / "sub" / "x", f"bind:{tmp_path}/decoy:{outside}/sub/x",
                    f"bind:{cover}:{outside}/sub", f"rm:{workspace}/other/copy.env",
                    outside / "sub" / "x")
    assert SECRET not in out
    assert f"{outside}/sub/x, in or above the root {outside}, is a mount of what a name " \
           "since removed named" in out, out


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
def test_a_mount_on_the_root_over_the_processs_own_hides_nothing(ws):
    """Attack 15, N2: `mount --bind / /` puts a mount on "/" above the one the process's root
    stays on; taken for the one seen at "/", it made every other mount look hidden, and the
    landlock tier judged none (the namespaces tier cannot start there: the kernel counts the
    root as changed). The kernel is asked which "/" the process sees."""
    workspace, outside = ws
    linked_secret(workspace)
    (outside / "view.env").write_text("")
    out = run_bound(workspace, outside, "landlock", workspace / "other" / "copy.env",
                    outside / "view.env", "bind:/:/", f"rm:{workspace}/other/copy.env",
                    outside / "view.env")
    assert SECRET not in out
    assert f"{outside}/view.env, in or above the root {outside}, is a mount of what a name " \
           "since removed named" in out, out


# In a private mount namespace: a directory chain longer than the kernel takes as a path in a
# read root, the denied directory bound at its end (by descriptor: no path reaches it), then the
# launch; its outcome.
DEEP = """
import ctypes, os, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[4])
import stockade
from conftest import PYTHON, policy_for
workspace, outside, isolation, _, vault = sys.argv[1:]
fd = os.open(outside, os.O_RDONLY | os.O_DIRECTORY)
for _ in range(30):  # (30 x 200 bytes: past PATH_MAX)
    os.mkdir("d" * 199, dir_fd=fd)
    fd = os.open("d" * 199, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
libc = ctypes.CDLL(None, use_errno=True)
tree = libc.syscall(428, -100, os.fsencode(vault), 1 | 0o2000000)  # open_tree: a clone
assert tree >= 0 and libc.syscall(429, tree, b"", fd, b"", 0x4 | 0x40) == 0, ctypes.get_errno()
policy = replace(policy_for(deny=(vault,), read=(outside,), pids=None), isolation=isolation)
try:
    r = stockade.run([PYTHON, "-c", "print('RAN')"], policy, workspace=workspace)
    print("EXIT", r.exit_code, r.stdout.decode())
except stockade.StockadeError as exc:
    print("REFUSED", exc.code, exc)
"""


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_mount_at_a_path_longer_than_the_kernel_takes_in_a_read_root_is_refused(
        ws, tmp_path, isolation):
    """Attack 16, M2: a denied directory bound at the end of a path longer than PATH_MAX in a
    read root: listed by the mount table, but never looked up (ENAMETOOLONG), so dropped; the
    command reached it a directory at a time and read the denied files. Refused, typed."""
    workspace, outside = ws
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "id").write_text(SECRET)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(stockade.__file__))}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           DEEP, str(workspace), str(outside), isolation,
                           os.path.dirname(__file__), str(vault)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    assert "REFUSED unenforceable:filesystem.read" in done.stdout, done.stdout
    assert "cannot be looked at by this user (File name too long)" in done.stdout, done.stdout
    assert (vault / "id").read_text() == SECRET


# In a private mount namespace: an overlay whose lower layer is the denied directory, written
# as `form` says, mounted in the read root; the launch reading it there.
OVERLAID = """
import os, subprocess, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[4])
import stockade
from conftest import PYTHON, policy_for
workspace, outside, isolation, _, spare, script, form, secrets = sys.argv[1:]
lower, cwd = {"plain": (secrets, None),
              "relative": (os.path.basename(secrets), os.path.dirname(secrets)),
              "link": (spare + "/link", None), "bind": (spare + "/bound", None),
              "bind-below": (spare + "/bound", None),
              "parent-link": (spare + "/link", None), "linked-layer": (spare + "/layer", None),
              "dotdot": (secrets + "/../" + os.path.basename(secrets), None)}[form]
if form in ("link", "parent-link"):
    os.symlink(secrets if form == "link" else os.path.dirname(secrets), lower)
if form == "linked-layer":  # (a layer holding another name of the denied file)
    os.mkdir(lower)
    os.link(secrets + "/prod.env", lower + "/prod.env")
if form in ("bind", "bind-below"):
    os.mkdir(lower)
    subprocess.run(["mount", "--bind", secrets + ("/sub" if form == "bind-below" else ""),
                    lower], check=True)
escaped = lower.replace(":", "\\\\:").replace(",", "\\\\,")
subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir={escaped},upperdir={spare}/u,workdir={spare}/w", f"{outside}/m"],
               check=True, cwd=cwd)
policy = replace(policy_for(deny=(secrets,), read=(outside,), pids=None), isolation=isolation)
try:
    r = stockade.run([PYTHON, "-c", script, outside + "/m/prod.env"], policy,
                     workspace=workspace)
    print("EXIT", r.exit_code, r.stdout.decode())
except stockade.StockadeError as exc:
    print("REFUSED", exc.code, exc)
"""


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("form", ["plain", "relative", "link", "bind", "dotdot", "colon",
                                  "parent-link", "bind-below"])
def test_an_overlay_of_a_denied_directory_in_a_read_root_is_refused(ws, tmp_path, isolation,
                                                                    form):
    """Attacks 18 (O1) and 19: an overlay whose layer is a denied directory shows its files on
    a device of its own, where no name is compared with the denied ones: the command read them
    through it in both isolations, and the table gives the layer as its mounter wrote it
    (relative, through a link, a bind of the denied directory, with `..`, with an escaped
    colon), or a bind of a directory inside the denied one (attack 27 P8: neither the layer's
    path nor an identity above the denied path tells). A root holding such an overlay is
    refused, typed, naming it."""
    workspace, outside = ws
    secrets = workspace / ("se:crets" if form == "colon" else "secrets")
    secret_at(secrets / "sub" / "prod.env" if form == "bind-below" else secrets / "prod.env")
    (outside / "m").mkdir()
    for name in ("u", "w"):
        (tmp_path / name).mkdir()
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(stockade.__file__))}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           OVERLAID, str(workspace), str(outside), isolation,
                           os.path.dirname(__file__), str(tmp_path), READ_ALL,
                           "plain" if form == "colon" else form, str(secrets)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout
    assert f"REFUSED unenforceable:filesystem.deny unenforceable:filesystem.deny: {outside}/m, " \
           f"an overlay in or above the root {outside}, " in done.stdout, done.stdout


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_denied_files_link_in_a_layer_of_an_overlay_in_a_read_root_refuses(ws, tmp_path,
                                                                            isolation):
    """Attack 34 H2: a denied file's other name lies in a directory outside every root that
    is a layer of an overlay in a read root: the read roots were looked through only on the
    file's own filesystem, which the overlay's directories are not, and the command read the
    file through the overlay. The overlay is looked through by its layers, and the launch is
    refused, naming the name the overlay shows."""
    workspace, outside = ws
    secrets = workspace / "secrets"
    secret_at(secrets / "prod.env")
    (outside / "m").mkdir()
    for name in ("u", "w"):
        (tmp_path / name).mkdir()
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(stockade.__file__))}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           OVERLAID, str(workspace), str(outside), isolation,
                           os.path.dirname(__file__), str(tmp_path), READ_ALL, "linked-layer",
                           str(secrets)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout
    assert "REFUSED unenforceable:filesystem.deny" in done.stdout, done.stdout
    assert f"{outside}/m/prod.env shows it in the read root {outside}" in done.stdout, \
        done.stdout


# In a private mount namespace: an overlay of the denied directory (its layers written as
# `form` says) at outside/m, the read root outside/m/sub, or outside/m itself for "nested" (an
# overlay whose layer is another overlay, of the denied directory, mounted outside the roots),
# or inside the read root outside, denied by the policy, for "denied-inside".
UNJUDGED = """
import ctypes, os, subprocess, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[4])
import stockade
from conftest import PYTHON, policy_for
workspace, outside, isolation, _, spare, script, form, secrets = sys.argv[1:]
point, read, deny = outside + "/m", outside + "/m/sub", (secrets,)
os.mkdir(point)
def overlay(options, at, cwd=None):
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, at], check=True, cwd=cwd)
def secret_to(directory):  # (the denied file moved to directory/secrets/sub)
    os.makedirs(directory + "/secrets/sub")
    os.rename(secrets + "/sub/prod.env", directory + "/secrets/sub/prod.env")
if form == "relative-above":  # (how an engine writes many layers: relative to its store)
    overlay("lowerdir=" + os.path.basename(secrets) + ":" + spare + "/empty", point,
            cwd=os.path.dirname(secrets))
elif form == "dotdot-above":
    overlay(f"lowerdir={spare}/empty/../{os.path.relpath(secrets, spare)}:{spare}/empty", point)
elif form == "proc-fd":  # (the mounter names the layer by its own descriptor: attack 27 P6)
    fd = os.open(secrets, os.O_RDONLY | os.O_DIRECTORY)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir=/proc/self/fd/{fd}:{spare}/empty", point],
                   check=True, pass_fds=(fd,))
    os.close(fd)
elif form == "escaped-above":  # (overlay drops a backslash; the table keeps it: attack 21)
    overlay(f"lowerdir={secrets[:-1]}\\{secrets[-1]}:{spare}/empty", point)
elif form == "foreign-inside":  # (mounted from a chroot, as WSL's are in another view: its
    # layers, harmless, found nowhere here)
    for name in ("gpu_lib", "gpu_inbox", "ovl"):
        os.makedirs(spare + "/vm/" + name)
    with open(spare + "/vm/gpu_lib/prod.env", "w") as f:
        f.write("a library")
    os.mkdir(point + "/sub")
    pid = os.fork()
    if pid == 0:
        os.chroot(spare + "/vm")
        libc = ctypes.CDLL(None, use_errno=True)
        os._exit(0 if libc.mount(b"overlay", b"/ovl", b"overlay", 0,
                                 b"lowerdir=/gpu_lib:/gpu_inbox") == 0 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    subprocess.run(["mount", "--move", spare + "/vm/ovl", point + "/sub"], check=True)
    read = outside
elif form == "blank-slash":  # (the table writes a blank as \\040; a "/" ends one)
    for name in ("s pace/sub", "slash"):
        os.makedirs(spare + "/" + name)
    with open(spare + "/s pace/sub/prod.env", "w") as f:
        f.write("a library")
    overlay(f"lowerdir={spare}/s pace:{spare}/slash/", point)
    read = outside
elif form == "store-data-only":  # (NixOS's /etc: names in a metadata layer, their data in a
    # store the read root holds, a data-only layer after "::")
    secret_to(spare + "/meta")
    os.mkdir(outside + "/store")
    with open(outside + "/store/prod.env", "w") as f:
        f.write("a library")
    overlay(f"lowerdir={spare}/meta::{outside}/store,metacopy=on,redirect_dir=follow", point)
    read, deny = outside, (point + "/secrets",)
elif form in ("layer-in-root", "layer-denied"):  # (the denied path lies on an overlay whose
    # lower layer a read root holds, where the file lies under the layer's name; R1)
    secret_to(outside + "/lower")
    os.mkdir(spare + "/ovl")
    overlay(f"lowerdir={outside}/lower:{spare}/empty", spare + "/ovl")
    read, deny = outside, (spare + "/ovl/secrets",)
    if form == "layer-denied":  # (the knob its refusal names)
        deny += (outside + "/lower",)
elif form == "layer-escaped":  # (its layer named with a backslash overlay drops)
    secret_to(outside + "/lower")
    os.mkdir(spare + "/ovl")
    overlay(f"lowerdir={outside}/lowe\\\\r:{spare}/empty", spare + "/ovl")
    read, deny = outside, (spare + "/ovl/secrets",)
elif form == "layer-bound":  # (its layer a bind mount, outside the roots, of the root's lower)
    secret_to(outside + "/lower")
    for name in ("lb", "ovl"):
        os.mkdir(spare + "/" + name)
    subprocess.run(["mount", "--bind", outside + "/lower", spare + "/lb"], check=True)
    overlay(f"lowerdir={spare}/lb:{spare}/empty", spare + "/ovl")
    read, deny = outside, (spare + "/ovl/secrets",)
elif form == "layer-nested":  # (that overlay's layer itself an overlay of the root's lower)
    secret_to(outside + "/lower")
    for name in ("ob", "ovl"):
        os.mkdir(spare + "/" + name)
    overlay(f"lowerdir={outside}/lower:{spare}/empty", spare + "/ob")
    overlay(f"lowerdir={spare}/ob:{spare}/empty", spare + "/ovl")
    read, deny = outside, (spare + "/ovl/secrets",)
elif form == "layer-shared":  # (its layer the lower layer of another overlay, in the root)
    secret_to(spare + "/L")
    for at in (spare + "/ovl", outside + "/view"):
        os.mkdir(at)
        overlay(f"lowerdir={spare}/L:{spare}/empty", at)
    read, deny = outside, (spare + "/ovl/secrets",)
elif form in ("shared-bound", "shared-nested"):  # (that lower layer shared with an overlay
    # in the root under another name, a bind of it, or through an overlay of it; attack 24)
    secret_to(spare + "/L")
    for name in ("ovl", "second", "e2"):
        os.mkdir(spare + "/" + name)
    overlay(f"lowerdir={spare}/L:{spare}/empty", spare + "/ovl")
    if form == "shared-bound":
        subprocess.run(["mount", "--bind", spare + "/L", spare + "/second"], check=True)
    else:
        overlay(f"lowerdir={spare}/L:{spare}/e2", spare + "/second")
    os.mkdir(outside + "/view")
    overlay(f"lowerdir={spare}/second:{spare}/empty", outside + "/view")
    read, deny = outside, (spare + "/ovl/secrets",)
elif form in ("beneath-source", "covered-denied-child"):  # (an overlay whose layer, a bind
    # of a directory the read root holds, it hides: at its point (attack 24, B5s), or below
    # it (attack 25, C3))
    secret_to(outside + "/etc")
    for name in ("fs/etc", "up", "wk"):
        os.makedirs(spare + "/" + name)
    subprocess.run(["mount", "--bind", outside + "/etc", spare + "/fs/etc"], check=True)
    at = spare + ("/fs/etc" if form == "beneath-source" else "/fs")
    overlay(f"lowerdir={spare}/fs/etc,upperdir={spare}/up,workdir={spare}/wk", at)
    read, deny = outside, (at + "/secrets",)
elif form == "point-denied":  # (the overlay's point itself denied; its lower in the root)
    secret_to(outside + "/lower")
    os.mkdir(spare + "/ovl")
    overlay(f"lowerdir={outside}/lower:{spare}/empty", spare + "/ovl")
    read, deny = outside, (spare + "/ovl",)
elif form == "beneath-bound":  # (an overlay on its own layer, as over /etc, and what it
    # covers bound, not recursively, into the root: attack 23, A5)
    secret_to(spare + "/fs/etc")
    for name in ("up", "wk"):
        os.mkdir(spare + "/" + name)
    overlay(f"lowerdir={spare}/fs/etc,upperdir={spare}/up,workdir={spare}/wk", spare + "/fs/etc")
    os.mkdir(outside + "/hostroot")
    subprocess.run(["mount", "--bind", spare + "/fs", outside + "/hostroot"], check=True)
    read, deny = outside, (spare + "/fs/etc/secrets",)
elif form == "state-on-overlay":  # (Stockade's state directory on an overlay whose upper
    # layer the write root holds: the command would write the host's state; attack 23, A4)
    for name in ("st", "wk"):
        os.mkdir(spare + "/" + name)
    os.mkdir(workspace + "/up")
    overlay(f"lowerdir={spare}/empty,upperdir={workspace}/up,workdir={spare}/wk", spare + "/st")
    os.environ["STOCKADE_STATE_DIR"] = spare + "/st/state"
    read = outside
elif form in ("covered-bind", "covered-child"):  # (an overlay mounted over a bind of the
    # denied directory, its layer the bind's name: at its point, or below it; attack 25)
    bound = point if form == "covered-bind" else point + "/hidden"  # (no name in its view)
    os.makedirs(bound, exist_ok=True)
    subprocess.run(["mount", "--bind", secrets, bound], check=True)
    overlay(f"lowerdir={bound}:{spare}/empty", point)
    read = outside
elif form == "nested":
    os.mkdir(spare + "/o1")
    overlay(f"lowerdir={secrets}:{spare}/empty", spare + "/o1")
    overlay(f"lowerdir={spare}/o1:{spare}/empty", point)
    read = outside
elif form == "denied-inside":  # (an overlay of the denied directory, its point denied too)
    overlay(f"lowerdir={secrets}:{spare}/empty", point)
    read, deny = outside, (secrets, point)
policy = replace(policy_for(deny=deny, read=(read,), pids=None), isolation=isolation)
try:
    target = {"nested": read + "/m/sub/prod.env", "denied-inside": read + "/m/sub/prod.env",
              "foreign-inside": read + "/m/sub/prod.env",
              "blank-slash": read + "/m/sub/prod.env",
              "store-data-only": read + "/store/prod.env",
              "layer-in-root": read + "/lower/secrets/sub/prod.env",
              "layer-denied": read + "/lower/secrets/sub/prod.env",
              "layer-nested": read + "/lower/secrets/sub/prod.env",
              "layer-escaped": read + "/lower/secrets/sub/prod.env",
              "layer-bound": read + "/lower/secrets/sub/prod.env",
              "layer-shared": read + "/view/secrets/sub/prod.env",
              "shared-bound": read + "/view/secrets/sub/prod.env",
              "shared-nested": read + "/view/secrets/sub/prod.env",
              "beneath-source": read + "/etc/secrets/sub/prod.env",
              "covered-bind": read + "/m/sub/prod.env",
              "covered-child": read + "/m/sub/prod.env",
              "covered-denied-child": read + "/etc/secrets/sub/prod.env",
              "point-denied": read + "/lower/secrets/sub/prod.env",
              "beneath-bound": read + "/hostroot/etc/secrets/sub/prod.env"}.get(
        form, read + "/sub/prod.env")
    extra = [read + "/m/secrets/sub/prod.env"] if form == "store-data-only" else []
    r = stockade.run([PYTHON, "-c", script, target, *extra], policy, workspace=workspace)
    print("EXIT", r.exit_code, r.stdout.decode())
except stockade.StockadeError as exc:
    print("REFUSED", exc.code, exc)
"""


def overlaid_run(ws, tmp_path, isolation: str, form: str, secrets) -> str:
    """What UNJUDGED printed, its mounts made in a private mount namespace."""
    workspace, outside = ws
    secret_at(secrets / "sub" / "prod.env")
    (secrets.parent / "empty").mkdir(exist_ok=True)
    (tmp_path / "empty").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(stockade.__file__))}
    done = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                           UNJUDGED, str(workspace), str(outside), isolation,
                           os.path.dirname(__file__), str(tmp_path), READ_ALL, form,
                           str(secrets)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    kept = {"layer-shared": tmp_path / "L" / "secrets",
            "shared-bound": tmp_path / "L" / "secrets",
            "shared-nested": tmp_path / "L" / "secrets",
            "beneath-source": outside / "etc" / "secrets",
            "covered-denied-child": outside / "etc" / "secrets",
            "beneath-bound": tmp_path / "fs" / "etc" / "secrets",
            "store-data-only": tmp_path / "meta" / "secrets"}.get(
        form, outside / "lower" / "secrets"
        if form.startswith("layer-") or form == "point-denied" else secrets)
    assert (kept / "sub" / "prod.env").read_text() == SECRET
    return done.stdout


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("form", ["relative-above", "dotdot-above", "escaped-above", "nested",
                                  "covered-bind", "covered-child", "proc-fd"])
def test_an_overlay_whose_layers_cannot_be_judged_is_refused_in_or_above_a_root(
        ws, tmp_path, isolation, form):
    """Attacks 20 (B1, B2, B11, B8), 21 (P2) and 25 (C1, C2): the table gives an overlay's
    layers as its mounter wrote them, where it stood then; one above the roots whose layer was
    written relative (as an engine writes many), with `..`, with a backslash overlay drops,
    one whose layer is another overlay (of the denied directory), or one mounted over a bind
    of the denied directory with that bind's name for its layer (which it then hides), or one
    whose layer the mounter named by its own descriptor through /proc (attack 27 P6), showed
    the denied files to the command in both isolations. Such a root is refused, typed, naming
    the overlay."""
    workspace, _ = ws
    said = overlaid_run(ws, tmp_path, isolation, form, workspace / "secrets")
    assert SECRET not in said
    why = {"relative-above": "has a layer 'secrets', written so",
           "dotdot-above": ", written so that where it lies cannot be told",
           "escaped-above": ", written so that where it lies cannot be told",
           "nested": f"has a layer {tmp_path}/o1 on the overlay at {tmp_path}/o1, which shows "
                     "the denied path ",
           "covered-bind": f"shows the denied path {workspace}/secrets through its layer "
                           f"{tmp_path}/outside/m, which it covers",
           "covered-child": f"has a layer {tmp_path}/outside/m/hidden below its own point, "
                            "which it hides: what that name named cannot be told",
           "proc-fd": "has a layer /proc/self/fd/"}[form]
    assert "REFUSED unenforceable:filesystem.deny" in said and why in said, said


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_overlay_in_a_read_root_that_the_policy_denies_is_masked_and_the_launch_goes_on(
        ws, tmp_path, isolation):
    """The knob a refusal of an overlay inside a root names: deny its mount point. The
    overlay (whose layer is the denied directory, which it showed at another name) is then
    masked whole, and its layers, each denied or outside the roots, hold nothing a root
    shows: the launch goes on, and nothing of it shows."""
    workspace, outside = ws
    said = overlaid_run(ws, tmp_path, isolation, "denied-inside", workspace / "secrets")
    assert SECRET not in said
    assert said.startswith("EXIT 0") and f"UNREAD {outside}/m/sub/prod.env" in said, said


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("form", ["foreign-inside", "blank-slash", "store-data-only"])
def test_an_everyday_overlay_in_a_read_root_is_read_as_it_is(ws, tmp_path, isolation, form):
    """Overlays hosts make, which show nothing denied, launch and are read: WSL's in /usr/lib
    (its GPU libraries, its kernel's modules) and systemd-sysext's on /usr, mounted from a
    view of their own, their layers found nowhere here (attack 21, F1 and F2); layers whose
    names hold a blank or end in "/" (attack 23, F1); NixOS's /etc, whose data-only layer (a
    store, after "::") a read root holds, a denied path among its names (attack 23, F2)."""
    workspace, outside = ws
    said = overlaid_run(ws, tmp_path, isolation, form, workspace / "secrets")
    assert SECRET not in said
    read = {"foreign-inside": f"READ {outside}/m/sub/prod.env a library",
            "blank-slash": f"READ {outside}/m/sub/prod.env a library",
            "store-data-only": f"READ {outside}/store/prod.env a library"}[form]
    assert said.startswith("EXIT 0") and read in said, said
    if form == "store-data-only":
        assert f"UNREAD {outside}/m/secrets/sub/prod.env" in said, said


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("form", ["layer-in-root", "layer-nested", "layer-escaped",
                                  "layer-bound", "layer-denied"])
def test_a_denied_path_on_an_overlay_whose_layer_a_root_holds_is_refused_unless_denied_there(
        ws, tmp_path, isolation, form):
    """Attacks 21 (R1, as `overlayroot` has it: the root an overlay, its lower disk mounted at
    /media/root-ro) and 22: the denied path lies on an overlay, and a read root holds the
    overlay's lower layer, where its files lie under the layer's names (as they were, renamed
    since, deleted from the overlay): refused, typed, naming the layer; with the layer denied
    too, the launch goes on and nothing of it shows."""
    workspace, outside = ws
    said = overlaid_run(ws, tmp_path, isolation, form, workspace / "secrets")
    assert SECRET not in said
    held = f"whose layer {outside}/lower the root {outside} holds or lies in"
    if form == "layer-in-root":
        assert "REFUSED unenforceable:filesystem.deny" in said \
            and f"lies on an overlay (at {tmp_path}/ovl) {held}" in said, said
    elif form == "layer-escaped":
        assert "REFUSED unenforceable:filesystem.deny" in said and (
            f"lies on an overlay (at {tmp_path}/ovl) whose layer '{outside}/lowe\\\\r:"
            f"{tmp_path}/empty', written so that where it lies cannot be told") in said, said
    elif form == "layer-bound":
        assert "REFUSED unenforceable:filesystem.deny" in said and (
            f"lies on an overlay (at {tmp_path}/ovl) whose layer {tmp_path}/lb a root shows at "
            f"{outside}/lower") in said, said
    elif form == "layer-nested":
        assert "REFUSED unenforceable:filesystem.deny" in said and (
            f"lies on an overlay (at {tmp_path}/ovl) whose layer {tmp_path}/ob lies on an "
            f"overlay (at {tmp_path}/ob) {held}") in said, said
    else:
        assert said.startswith("EXIT 0") and f"UNREAD {outside}/lower/secrets/sub/prod.env" \
            in said, said


@pytest.mark.root_only("an overlay mount needs root (rootless users cannot make one here)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("form", ["layer-shared", "shared-bound", "shared-nested",
                                  "point-denied", "beneath-bound", "beneath-source",
                                  "covered-denied-child", "state-on-overlay"])
def test_a_denied_path_an_overlay_holds_that_a_root_reaches_another_way_is_refused(
        ws, tmp_path, isolation, form):
    """Attacks 23 and 24: the files of a denied path on an overlay reached in a root another
    way: through a second overlay of the same lower layer (A1), under another name (a bind of
    it) or through an overlay of it (B1, B2), through the layer of an overlay
    whose point is the denied path (A2), beneath an overlay on its own layer where a bind
    that is not recursive shows what it covers (A5), or where what it covers is a bind of a
    root's directory (B5s), or Stockade's own state directory on
    an overlay whose upper layer the write root holds (A4: the command writes the host's
    state). Each refused, typed, naming how."""
    workspace, outside = ws
    said = overlaid_run(ws, tmp_path, isolation, form, workspace / "secrets")
    assert SECRET not in said
    how = {"layer-shared": f"(at {tmp_path}/ovl) whose layer {tmp_path}/L the overlay at "
                           f"{outside}/view, in a root, has too",
           "shared-bound": f"(at {tmp_path}/ovl) whose layer {tmp_path}/L the overlay at "
                           f"{outside}/view, in a root, has too",
           "shared-nested": f"(at {tmp_path}/ovl) whose layer {tmp_path}/L the overlay at "
                            f"{tmp_path}/second, in a root, has too",
           "beneath-source": f"(at {tmp_path}/fs/etc) whose layer {tmp_path}/fs/etc, beneath "
                             f"it, a root shows at {outside}/etc",
           "covered-denied-child": f"(at {tmp_path}/fs) whose layer {tmp_path}/fs/etc below "
                                   "its own point, which it hides: what that name named cannot "
                                   "be told",
           "point-denied": f"(at {tmp_path}/ovl) whose layer {outside}/lower the root "
                           f"{outside} holds or lies in",
           "beneath-bound": f"(at {tmp_path}/fs/etc) whose layer {tmp_path}/fs/etc, beneath "
                            f"it, a root shows at {outside}/hostroot/etc",
           "state-on-overlay": f"the denied path {tmp_path}/st/state lies on an overlay (at "
                               f"{tmp_path}/st) whose layer {workspace}/up the root "
                               f"{workspace} holds"}[form]
    assert "REFUSED unenforceable:filesystem.deny" in said and how in said, said


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_read_root_binding_a_directory_above_a_denied_mount_is_refused_by_the_tier(
        ws, tmp_path, isolation):
    """Attack 11, dl9c-ancestor_inode_denied: the denied file lies on a mount of its own
    (secrets/), and the read root is a non-recursive bind of the workspace's parent, which
    does not show that mount, so nothing denied lies below it by name: the landlock tier gave it
    its rule whole, and a rule holds for the directory, every path through it, the denied
    file's own path too. The tier refuses such a rule, typed; a view masks the file."""
    workspace, outside = ws
    vault = tmp_path / "vault"
    vault.mkdir()
    (vault / "prod.env").write_text(SECRET)
    (workspace / "secrets").mkdir()
    out = run_bound(workspace, outside, isolation, workspace.parent, outside,
                    f"bind:{vault}:{workspace}/secrets", "secrets/prod.env",
                    outside / "ws" / "secrets" / "prod.env")
    assert SECRET not in out
    if isolation == "landlock":
        assert f"REFUSED unenforceable:filesystem.deny unenforceable:filesystem.deny: " \
               f"{outside}/ws is, under another name (a bind mount), a directory above " \
               f"{workspace}/secrets/prod.env" in out, out
    else:
        assert "EXIT 0" in out and "UNREAD secrets/prod.env" in out, out
    assert (vault / "prod.env").read_text() == SECRET


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_write_roots_that_bind_each_other_never_show_a_denied_file(ws, tmp_path, isolation):
    """Attack 11, dl9c-two_writes_whole: two write roots, each bound into the other
    (ws2/view shows the workspace, ws/back2 shows ws2): the carve gave ws/back2, which is ws2
    itself, its rule whole, and the denied file read through ws2/view. The tier refuses the
    rule, typed; a view masks the file at each of its names."""
    workspace, outside = ws
    secret_at(workspace / "secrets" / "prod.env")
    ws2 = tmp_path / "ws2"
    (ws2 / "view").mkdir(parents=True)
    (workspace / "back2").mkdir()
    out = run_bound(workspace, outside, isolation, workspace, ws2 / "view",
                    f"write:{ws2}", f"{ws2}/view/secrets/prod.env", "back2/view/secrets/prod.env",
                    "secrets/prod.env", f"bind:{ws2}:{workspace}/back2")
    assert SECRET not in out
    if isolation == "landlock":
        assert "REFUSED unenforceable:filesystem.deny" in out, out
    else:
        assert "EXIT 0" in out and "UNREAD secrets/prod.env" in out, out
        assert f"UNREAD {ws2}/view/secrets/prod.env" in out, out


WRITE_ALL = """
import sys
for name in sys.argv[1:]:
    try:
        with open(name, "w") as f:
            f.write("planted")
        print("WROTE", name)
    except OSError as exc:
        print("UNWRITTEN", name, exc.errno)
"""


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("bound", [".vscode", ".mcp.json", ".git/hooks"])
def test_a_protected_object_a_bind_mount_shows_elsewhere_in_a_write_root_stays_read_only(
        ws, isolation, bound):
    """Attack 12, P1: a protected object bound at a second path in a write root (`.vscode`,
    `.mcp.json`, a repository's hooks) was found by name only and re-mounted read-only there;
    its other name stayed writable and the host's editor, agent or git ran what was written
    through it. Every path a mount shows a protected object at in a write root is protected."""
    workspace, outside = ws
    secret_at(workspace / "secrets" / "prod.env")  # (what BOUND's policy denies)
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / ".vscode").mkdir()
    for path in (workspace / ".git" / "hooks" / "pre-commit", workspace / ".vscode" / "tasks.json",
                 workspace / ".mcp.json"):
        path.write_text("orig")
    (workspace / "sub").mkdir()
    source = workspace / bound
    target = workspace / "sub" / "alias"
    if source.is_dir():
        target.mkdir()
        inside = sorted(os.listdir(source))
    else:
        target.write_text("")
        inside = []
    written = [target / name for name in inside] if inside else [target]
    out = run_bound(workspace, outside, isolation, source, target, *written, script=WRITE_ALL)
    assert "WROTE" not in out, out
    assert "EXIT 0" in out, out
    for path in [source / name for name in inside] if inside else [source]:
        assert path.read_text() == "orig", path


@pytest.mark.root_only("a bind mount needs root (rootless users cannot make one)")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_write_root_that_is_a_guarded_directory_under_another_name_stays_read_only(
        ws, isolation):
    """Attack 13, E1: the workspace bound at a second path, and two of its directories given
    as write roots by their names there: what the repository's configuration protects in them
    (an included file, the hooks path) was read-only at its workspace name only, and the
    command wrote it through the other. Each write root's other names are looked through."""
    workspace, outside = ws
    secret_at(workspace / "secrets" / "prod.env")  # (what BOUND's policy denies)
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text(
        "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../conf/inc\n")
    (workspace / "conf").mkdir()
    (workspace / "conf" / "inc").write_text("orig")
    (workspace / "tools" / "hooks").mkdir(parents=True)
    (workspace / "tools" / "hooks" / "pre-commit").write_text("orig")
    (outside / "alias").mkdir()
    alias = outside / "alias"
    out = run_bound(workspace, outside, isolation, workspace, alias,
                    f"write:{alias}/conf", f"write:{alias}/tools", alias / "conf" / "inc",
                    alias / "tools" / "hooks" / "pre-commit", script=WRITE_ALL)
    assert "WROTE" not in out, out
    assert "EXIT 0" in out or "REFUSED unenforceable:filesystem.protected" in out, out
    assert (workspace / "conf" / "inc").read_text() == "orig"
    assert (workspace / "tools" / "hooks" / "pre-commit").read_text() == "orig"


TAMPER = """
import os
os.chmod("a", 0o755)
try:
    with open("a/.mcp.json", "w") as f:
        f.write("planted")
    print("WROTE")
except OSError as exc:
    print("REFUSED", exc.errno)
"""


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_directory_of_the_users_the_walk_cannot_read_refuses_the_launch(ws, isolation):
    """Attack 9, dl9f: a directory of the user's in a write root that the launch's walk may not
    read (mode 000, which an earlier run may have set) hid what is in it: the command sets the
    mode back and writes a protected name the walk never saw (it was not re-mounted read-only).
    Rootless, where the walk has no privilege over the user's files, that is refused, typed,
    naming the directory; as root the walk sees it and the name stays protected."""
    workspace, _ = ws
    (workspace / "a").mkdir()
    (workspace / "a" / ".mcp.json").write_text("orig")
    (workspace / "a").chmod(0)
    try:
        policy = replace(policy_for(pids=None), isolation=isolation)
        if os.getuid() != 0:
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run([PYTHON, "-c", TAMPER], policy, workspace=workspace)
            assert refused.value.code == "unenforceable:filesystem.write"
            assert f"{workspace}/a" in refused.value.message
            assert "cannot be read whole" in refused.value.message
            return
        r = stockade.run([PYTHON, "-c", TAMPER], policy, workspace=workspace)
        assert "WROTE" not in r.stdout.decode(), r.stdout
    finally:
        (workspace / "a").chmod(0o755)
    assert (workspace / "a" / ".mcp.json").read_text() == "orig"


# A directory of another user's in a write root that this user may enter (and here write) but
# not list: scripts/test.sh gives its rootless pass one (STOCKADE_TEST_UNLISTED_DIR, 0733,
# nobody's); as root the test makes its own.
PLANT_IN_UNLISTED = """
import os, sys
mine = sys.argv[1]
try:
    with open(os.path.join(mine, ".mcp.json"), "w") as f:
        f.write("planted")
    print("WROTE")
except OSError as exc:
    print("REFUSED", exc.errno)
"""


@pytest.mark.root_only("needs a directory of another user's, which only root can make "
                       "(scripts/test.sh gives its rootless pass one: STOCKADE_TEST_UNLISTED_DIR)",
                       unless_env="STOCKADE_TEST_UNLISTED_DIR")
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_another_users_directory_the_command_may_enter_but_not_list_refuses_the_launch(
        tmp_path, isolation):
    """Attack 10, b01/b04: a directory of another user's that this user may search but not
    list (0711, 0733, an ACL) was passed over by the walk, as if the command could not enter
    it either; it can, by name, and this user's own directories inside (a repository, an
    editor's configuration) were writable whole: the host's git or editor ran what the command
    wrote. Where the launch's walk cannot list it (rootless; as root in the namespaces tier,
    whose walk holds no capability over an unmapped owner's files) it refuses the launch,
    typed, naming it; where it can (root, the landlock tier) the protected name stays
    read-only."""
    import uuid

    given = os.environ.get("STOCKADE_TEST_UNLISTED_DIR")
    if given is None:  # (root: its own)
        given = str(tmp_path / "unlisted")
        os.mkdir(given)
        os.chown(given, 65534, 65534)
        os.chmod(given, 0o733)
        os.chmod(tmp_path, 0o755)
    mine = os.path.join(given, f"mine-{uuid.uuid4().hex}")  # (known to this test alone)
    os.mkdir(mine)
    try:
        with open(os.path.join(mine, ".mcp.json"), "w") as f:
            f.write("orig")
        policy = replace(policy_for(write=(given,), pids=None), isolation=isolation)
        if os.getuid() != 0 or isolation == "namespaces":
            with pytest.raises(stockade.UnenforceableError) as refused:
                stockade.run([PYTHON, "-c", PLANT_IN_UNLISTED, mine], policy, workspace=mine)
            assert refused.value.code == "unenforceable:filesystem.write"
            assert f"{given} in the write root {given} is another user's" \
                in refused.value.message, refused.value.message
        else:
            r = stockade.run([PYTHON, "-c", PLANT_IN_UNLISTED, mine], policy, workspace=mine)
            assert "WROTE" not in r.stdout.decode(), r.stdout
        with open(os.path.join(mine, ".mcp.json")) as f:
            assert f.read() == "orig"
    finally:
        for name in os.listdir(mine):
            os.unlink(os.path.join(mine, name))
        os.rmdir(mine)


@pytest.mark.parametrize("mounted_at", ["/", "parent"])
def test_only_the_overlay_the_processs_own_root_is_goes_unjudged(ws, monkeypatch, mounted_at):
    """A container's root is an overlay whose layers lie outside its view (its engine writes
    them relative to its store when they are many): judged by nothing, so refusing nothing,
    the command unable to reach them either. The same overlay anywhere else above a root is
    refused. (Pure logic, on a table the test gives: the first is the container's own
    world, which no test here can make.)"""
    from stockade.errors import UnenforceableError
    from stockade.launch.compile import CompileContext, compile_policy
    from stockade.lifecycle import aliases

    workspace, _ = ws
    real = aliases.table()
    point = "/" if mounted_at == "/" else str(workspace.parent)
    engine = aliases.Mount("0:4242", "/", point, "424242", real.at["/"].id,
                           ("l/ABC", "l/DEF", "../diff"))
    at = {**real.at, point: engine}
    of: dict[str, list[aliases.Mount]] = {}
    for mount in at.values():
        of.setdefault(mount.device, []).append(mount)
    monkeypatch.setattr(aliases, "table", lambda: aliases.Mounts(at, of))
    compile_it = lambda: compile_policy(policy_for(), ["true"],  # noqa: E731
                                        CompileContext.current(workspace))
    if mounted_at == "/":
        compile_it()
    else:
        with pytest.raises(UnenforceableError, match="has a layer 'l/ABC', written so"):
            compile_it()
