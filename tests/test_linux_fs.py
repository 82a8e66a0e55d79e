"""Filesystem boundary: real children try to escape their roots; the host must not change."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PYTHON, py, sandbox, unavailable

import stockade

pytestmark = pytest.mark.usefixtures("linux")


def snapshot(path):
    """Names, sizes, contents and modes of everything below `path` (no symlinks followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            body = Path(full).read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(full, path)] = (st.st_mode, st.st_size, body)
    return out


def test_files_are_made_with_the_launching_umask(ws):
    """The owner's umask at launch, whatever it was when the zygote or skeleton was made."""
    workspace, _ = ws
    previous = os.umask(0o022)
    try:
        for umask, mode in ((0o077, 0o600), (0o022, 0o644), (0o027, 0o640)):
            os.umask(umask)
            r = sandbox(["sh", "-c", f"touch made-{umask:o}"], workspace)
            assert r.exit_code == 0, r.stderr
            assert stat.S_IMODE((workspace / f"made-{umask:o}").stat().st_mode) == mode
    finally:
        os.umask(previous)


def test_read_outside_every_root_fails(ws):
    workspace, outside = ws
    (outside / "secret").write_text("TOPSECRET")
    r = sandbox(["cat", str(outside / "secret")], workspace)
    assert r.exit_code != 0
    assert b"TOPSECRET" not in r.stdout


def test_write_outside_every_root_fails(ws):
    workspace, outside = ws
    before = snapshot(outside)
    r = sandbox(["sh", "-c", f"echo pwned > {outside}/new; echo pwned > {outside}/../new2"],
                workspace)
    assert r.exit_code != 0
    assert snapshot(outside) == before
    assert not (outside.parent / "new2").exists()


def test_write_to_read_root_fails(ws):
    workspace, _ = ws
    (workspace / "file").write_text("original")
    before = snapshot(workspace)
    r = sandbox(["sh", "-c", "echo pwned > file; echo x > new; rm -f file"], workspace,
                "read-only")
    assert r.exit_code != 0
    assert b"Read-only file system" in r.stderr
    assert snapshot(workspace) == before


def make_repo(path):
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "config").write_text("[core]\n")
    (path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")


def test_protected_metadata_at_depth_stays_read_only(ws):
    """(The repositories' hooks, configuration and pointers: the rest of `.git` is writable,
    see test_linux_git.py.)"""
    workspace, _ = ws
    make_repo(workspace)
    make_repo(workspace / "sub")
    (workspace / "sub" / "deeper").mkdir()
    (workspace / "sub" / "deeper" / ".git").write_text("gitdir: ../.git\n")
    before = snapshot(workspace)
    r = sandbox(["sh", "-c",
                 "echo '[core] hooksPath=/tmp' >> .git/config; echo x > sub/.git/config;"
                 " echo y > sub/.git/hooks/post-checkout; echo z > sub/deeper/.git;"
                 " rm -rf sub/.git/hooks; mv sub/.git sub/git2; echo ok > written"], workspace)
    assert r.exit_code == 0, r.stderr  # the last write, outside protected names, works
    after = snapshot(workspace)
    assert after.pop("written")[2] == b"ok\n"
    assert after == before


def test_renaming_a_protected_directorys_parent_fails(ws):
    workspace, _ = ws
    make_repo(workspace / "pkg")
    before = snapshot(workspace)
    r = sandbox(["sh", "-c", "mv pkg pkg2 && mkdir -p pkg/.git && echo evil > pkg/.git/config"],
                workspace)
    assert r.exit_code != 0
    assert snapshot(workspace) == before


def test_what_is_protected_inside_a_grant_inside_a_protected_name_stays_protected(ws):
    """The honoured grant `.codex/v/t` is a write root like any: its own protected names and
    its repository's hooks stay read-only (the grant was mounted over them: they were
    writable), and so does the rest of `.codex`. A protected name granted itself is writable."""
    workspace, _ = ws
    nested = workspace / ".codex" / "v" / "t"
    (nested / ".agents").mkdir(parents=True)
    (nested / "r" / ".git" / "hooks").mkdir(parents=True)
    (nested / "r" / ".git" / "config").write_text("[core]\n")
    (workspace / ".agents").mkdir()
    before = snapshot(workspace)
    r = sandbox(["sh", "-c", "echo ok > .codex/v/t/made; for p in .codex/v/t/.agents/x "
                 ".codex/v/t/r/.git/hooks/pre-commit .codex/v/t/r/.git/config .codex/y; do "
                 "echo pwned > $p && echo WROTE $p; done; echo ok > .agents/made"], workspace,
                write=(str(workspace), str(nested), str(workspace / ".agents")))
    assert b"WROTE" not in r.stdout, r
    after = snapshot(workspace)
    assert after.pop(".codex/v/t/made")[2] == b"ok\n", r.stderr
    assert after.pop(".agents/made")[2] == b"ok\n", r.stderr
    assert after == before


CODE_RUNNING_FILES = (".mcp.json", ".gitmodules", ".ripgreprc", ".envrc", ".bashrc",
                      ".bash_profile", ".profile", ".zshrc", ".zprofile", ".gitconfig",
                      "mise.toml", ".mise.toml", ".npmrc", ".yarnrc", ".yarnrc.yml",
                      ".pre-commit-config.yaml")
CODE_RUNNING_DIRS = (".vscode", ".idea", ".devcontainer", ".claude")


def test_files_that_make_host_tools_run_code_are_read_only_by_default(ws):
    """What a host tool runs code from later (an MCP server list, editor tasks, agents'
    commands and hooks, submodule URLs, direnv, shell start-up files, git's configuration) is
    read-only at every depth of a workspace under the default policy (all were writable);
    "!NAME" makes one writable again."""
    workspace, _ = ws
    for top in (workspace, workspace / "pkg" / "sub"):
        for name in CODE_RUNNING_DIRS:
            (top / name / "inner").mkdir(parents=True)
            (top / name / "inner" / "tasks.json").write_text("{}\n")
        for name in CODE_RUNNING_FILES:
            (top / name).write_text("original\n")
    before = snapshot(workspace)
    targets = [f"{top}{name}" for top in ("", "pkg/sub/") for name in CODE_RUNNING_FILES]
    targets += [f"{top}{name}/{leaf}" for top in ("", "pkg/sub/") for name in CODE_RUNNING_DIRS
                for leaf in ("inner/tasks.json", "new.json")]
    script = "".join(f"echo pwned > {p} && echo WROTE {p}; " for p in targets)
    r = sandbox(["sh", "-c", script + "echo ok > written"], workspace)
    assert b"WROTE" not in r.stdout, r.stdout
    after = snapshot(workspace)
    assert after.pop("written")[2] == b"ok\n", r.stderr
    assert after == before
    r = sandbox(["sh", "-c", "echo mine > .vscode/inner/tasks.json && echo mine > .envrc"],
                workspace, protected=tuple(n for n in stockade.preset("workspace-write")
                                           .filesystem.protected if n != ".vscode"))
    assert r.exit_code != 0 and b".envrc" in r.stderr, r  # only .vscode was released
    assert (workspace / ".vscode" / "inner" / "tasks.json").read_text() == "mine\n"
    assert (workspace / ".envrc").read_text() == "original\n"


def test_git_works_when_dot_git_is_created_inside_the_run(ws):
    workspace, _ = ws
    if not shutil.which("git"):
        unavailable("git is not installed")
    r = sandbox(["sh", "-c", "git init -q . && echo hi > a.txt && git add a.txt && "
                 "git -c user.name=t -c user.email=t@example.invalid commit -qm first && "
                 "git log --oneline | wc -l"], workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == b"1"
    assert (workspace / ".git" / "HEAD").exists()


def test_pre_planted_symlink_to_outside_cannot_be_followed(ws):
    workspace, outside = ws
    (outside / "target").write_text("outside-content")
    os.symlink(outside / "target", workspace / "abs-link")
    os.symlink(os.path.relpath(outside / "target", workspace), workspace / "rel-link")
    os.symlink(outside, workspace / "dir-link")
    before = snapshot(outside)
    r = sandbox(["sh", "-c", "cat abs-link rel-link dir-link/target; echo pwned > abs-link;"
                 " echo pwned > rel-link; echo pwned > dir-link/new"], workspace)
    assert r.exit_code != 0
    assert b"outside-content" not in r.stdout
    assert snapshot(outside) == before


def test_symlink_created_at_run_time_cannot_escape(ws):
    workspace, outside = ws
    (outside / "target").write_text("outside-content")
    before = snapshot(outside)
    r = sandbox(["sh", "-c", f"ln -s {outside}/target l1 && ln -s ../outside l2 &&"
                 " cat l1 l2/target; echo pwned > l1; echo pwned > l2/new"], workspace)
    assert b"outside-content" not in r.stdout
    assert snapshot(outside) == before


def test_pre_planted_hard_link_to_outside_file_is_read_only(ws):
    workspace, outside = ws
    (outside / "target").write_text("outside-content")
    os.link(outside / "target", workspace / "hard")
    r = sandbox(["sh", "-c", "echo pwned > hard"], workspace)
    assert r.exit_code != 0
    assert (outside / "target").read_text() == "outside-content"


def test_hard_link_created_at_run_time_to_a_read_root_fails(ws):
    workspace, _ = ws
    r = sandbox(["ln", "/etc/hostname", "stolen"], workspace)
    assert r.exit_code != 0
    assert not (workspace / "stolen").exists()


def test_exec_from_write_root_is_denied_when_exec_from_write_is_false(ws):
    """(workspace-write runs what the job builds; its no-exec twin and exec_from_write = false
    do not, and the refusal names the knob.)"""
    workspace, _ = ws
    r = sandbox(["sh", "-c", "cp /bin/true ./mytrue && chmod +x ./mytrue && ./mytrue"], workspace,
                "workspace-write-no-exec")
    assert r.exit_code != 0
    assert b"Permission denied" in r.stderr
    (workspace / "mytrue").chmod(0o755)
    with pytest.raises(stockade.StartError) as refused:
        sandbox(["./mytrue"], workspace, exec_from_write=False)
    assert refused.value.code == "command_not_executable"
    assert "exec_from_write" in refused.value.message
    assert "workspace-write" in refused.value.message
    assert sandbox(["./mytrue"], workspace).exit_code == 0  # the preset's default


def test_exec_from_write_root_allowed_when_policy_says_so(ws):
    workspace, _ = ws
    r = sandbox(["sh", "-c", "cp /bin/true ./mytrue && chmod +x ./mytrue && ./mytrue"], workspace,
                exec_from_write=True)
    assert r.exit_code == 0, r.stderr


def test_denied_path_inside_a_granted_root_is_masked(ws):
    workspace, _ = ws
    (workspace / "keys").mkdir()
    (workspace / "keys" / "id").write_text("PRIVATE")
    (workspace / "token").write_text("TOKEN")
    r = sandbox(["sh", "-c", "cat keys/id; cat token; ls keys; echo x > keys/new; echo x > token"],
                workspace, deny=(str(workspace / "keys"), str(workspace / "token")))
    assert r.exit_code != 0
    assert b"PRIVATE" not in r.stdout and b"TOKEN" not in r.stdout
    assert sorted(os.listdir(workspace / "keys")) == ["id"]
    assert (workspace / "token").read_text() == "TOKEN"


def test_host_processes_are_not_reachable_through_proc(ws):
    workspace, _ = ws
    me = os.getpid()
    r = py(f"""
import os
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
print(len(pids))
try:
    print(open('/proc/{me}/environ','rb').read()[:0], 'READ')
except OSError as e:
    print('denied', e.errno)
for path in ('/proc/1/root/etc/shadow', '/proc/self/root/../../etc/shadow'):
    try:
        open(path).read(); print('READ', path)
    except OSError:
        pass
""", workspace)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.decode().split("\n")
    assert int(lines[0]) <= 3  # init, the interpreter, maybe nothing else
    assert "READ" not in r.stdout.decode()


def test_mknod_and_block_devices_are_unavailable(ws):
    workspace, _ = ws
    r = py("""
import os, stat
for fn in (lambda: os.mknod('dev0', stat.S_IFCHR | 0o600, os.makedev(1, 3)),
           lambda: os.mknod('/tmp/fifo', stat.S_IFBLK | 0o600, os.makedev(8, 0)),
           lambda: open('/dev/sda', 'rb'), lambda: open('/dev/mem', 'rb'),
           lambda: open('/dev/kmsg', 'rb')):
    try:
        fn(); print('ALLOWED')
    except OSError as e:
        print('denied', e.errno)
""", workspace)
    assert r.exit_code == 0, r.stderr
    assert b"ALLOWED" not in r.stdout
    assert not (workspace / "dev0").exists()


def test_truncate_of_a_read_only_file_fails(ws):
    workspace, _ = ws
    (workspace / "data").write_text("keep me")
    r = py("import os; os.truncate('data', 0)", workspace, "read-only")
    assert r.exit_code != 0
    assert (workspace / "data").read_text() == "keep me"


def test_private_tmp_is_gone_afterwards(ws):
    workspace, _ = ws
    marker = f"stockade-tmp-marker-{os.getpid()}"
    r = sandbox(["sh", "-c", f"echo x > /tmp/{marker} && ls /tmp"], workspace)
    assert r.exit_code == 0, r.stderr
    assert marker.encode() in r.stdout
    assert not os.path.exists(f"/tmp/{marker}")


def test_ordinary_tools_work_under_workspace_write(ws):
    workspace, _ = ws
    (workspace / "script.py").write_text(
        "import json, pathlib\npathlib.Path('out.json').write_text(json.dumps({'ok': 1}))\n")
    r = sandbox(["sh", "-c", f"{PYTHON} script.py && cat out.json | tr -d '{{}}' | sort | wc -c"],
                workspace)
    assert r.exit_code == 0, r.stderr
    assert (workspace / "out.json").read_text() == '{"ok": 1}'


def test_c_compile_and_run_with_exec_from_write(ws):
    workspace, _ = ws
    cc = shutil.which("cc")
    if not cc:
        unavailable("no C compiler installed")
    (workspace / "hello.c").write_text('#include <stdio.h>\nint main(){puts("hi");return 0;}\n')
    r = sandbox(["sh", "-c", "cc -o hello hello.c && ./hello"], workspace, "offline-build")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == b"hi\n"


def test_missing_read_root_is_an_error(ws):
    workspace, outside = ws
    from stockade.errors import PolicyError
    with pytest.raises(PolicyError, match="does not exist"):
        sandbox(["true"], workspace, read=(str(outside / "missing"),))


def test_symlinked_protected_name_is_refused(ws):
    """(A `.git` that is a link: test_linux_git.py.)"""
    workspace, outside = ws
    os.symlink(outside, workspace / ".agents")
    from stockade.errors import UnenforceableError
    with pytest.raises(UnenforceableError) as info:
        sandbox(["true"], workspace)
    assert info.value.code == "unenforceable:filesystem.protected"


def test_host_unchanged_by_a_run_that_writes_the_workspace(ws):
    workspace, outside = ws
    r = sandbox(["sh", "-c", "mkdir d && echo 1 > d/f && mv d e"], workspace)
    assert r.exit_code == 0, r.stderr
    assert (workspace / "e" / "f").read_text() == "1\n"
    out = subprocess.run(["ls", "-A", str(outside)], capture_output=True, text=True).stdout
    assert out == ""


def test_protected_names_match_in_any_case(ws):
    """On a case-folding filesystem `.GIT` is `.git`, so every spelling is protected."""
    workspace, _ = ws
    (workspace / ".Git").mkdir()
    (workspace / ".Git" / "config").write_text("[core]\n")
    r = sandbox(["sh", "-c", "echo evil >> .Git/config"], workspace)
    assert r.exit_code != 0
    assert (workspace / ".Git" / "config").read_text() == "[core]\n"


def test_ram_tmp_is_bounded_by_the_memory_limit(ws):
    workspace, _ = ws
    r = sandbox(["sh", "-c", "head -c 8000000 /dev/zero > /tmp/fill || echo FULL"],
                workspace, memory=4 << 20, file_size=64 << 20)
    assert r.stdout == b"FULL\n"
    assert b"No space left" in r.stderr


@pytest.mark.root_only("mounting on the host needs root")
def test_a_host_mount_made_after_start_is_seen_by_the_next_launch(ws):
    """A spare sandbox's mount namespace is a copy from when it was made: a later host mount
    must not leave the next launch with a stale view."""
    workspace, _ = ws
    (workspace / "under").write_text("u")
    assert sandbox(["ls"], workspace).stdout == b"under\n"  # a spare exists now
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(workspace)], check=True)
    try:
        (workspace / "over").write_text("o")
        assert sandbox(["ls"], workspace).stdout == b"over\n"
    finally:
        subprocess.run(["umount", str(workspace)], check=True)


def test_a_root_containing_the_build_stage_is_the_hosts_tree(ws):
    """pid 1 builds the view on /tmp (init.STAGE) before it pivots: a root that contains it,
    such as /tmp itself, is still the host's tree, not the view seen again."""
    workspace, _ = ws
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="stockade-stage-") as mark:
        name = os.path.basename(mark.name)
        r = sandbox(["sh", "-c", f"ls -A /tmp; echo x > /tmp/{name}-new || echo refused"],
                    workspace, read=("/tmp",))
    listing = r.stdout.decode().split()
    assert name in listing and "proc" not in listing, listing
    assert listing[-1] == "refused" and not os.path.exists(f"/tmp/{name}-new")


def test_the_whole_tree_as_read_root_starts_in_a_workspace_below_tmp_with_denies_masked(ws):
    """`read = ["/"]` alone, run from a workspace below /tmp (which the sandbox has of its
    own): the launch failed with privilege_failed (no such working directory). The workspace is
    seen, read-only, as "/" grants it; the policy's and the default denies stay masked."""
    workspace, _ = ws
    (workspace / "keys").mkdir()
    (workspace / "keys" / "id").write_text("PRIVATE")
    (workspace / "notes").write_text("readable")
    base = stockade.preset("read-only")
    policy = replace(base, filesystem=replace(
        base.filesystem, read=("/",), write=(),
        deny=base.filesystem.deny + (str(workspace / "keys"),)))
    r = stockade.run(["sh", "-c", "pwd; cat notes; echo; cat keys/id; ls keys; "
                                  "cat /etc/shadow /etc/security/opasswd; echo x > new"],
                     policy, workspace=workspace)
    assert r.stdout.startswith(f"{workspace}\nreadable\n".encode()), (r.stdout, r.stderr)
    assert b"PRIVATE" not in r.stdout and b"root:" not in r.stdout
    assert b"keys/id: Permission denied" in r.stderr
    assert b"new: Read-only file system" in r.stderr
    assert sorted(os.listdir(workspace)) == ["keys", "notes"]
