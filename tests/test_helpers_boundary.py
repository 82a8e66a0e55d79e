"""Stockade's own helpers inside the threat model: the daemon's and the CLI server's sockets, the
state directory, and what a sandbox could leave behind for the host (privilege bits) or plant
for a later launch (links, absent denied paths). Real children attack each from inside a real
sandbox; each test also shows the attempt succeeds where the defence is absent (on the host,
or with exactly that layer switched off), and that nothing changed outside."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import PYTHON, policy_for, py, sandbox

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy import merge
from stockade.program import NOT_SERVED, SOCKET_NAME

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]
REPO = str(Path(__file__).resolve().parent.parent)


def run_with(backend: LinuxBackend, argv: list[str], workspace: Path, **changes) -> stockade.Result:
    request = compile_policy(policy_for(**changes), argv, CompileContext.current(workspace))
    return execute(backend, request)


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    """A running `stockade daemon` whose state directory lies inside the workspace (as it does
    for a command started from $HOME): (workspace, state directory, environment)."""
    workspace = tmp_path / "ws"
    state = workspace / "state"
    workspace.mkdir()
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(state)}
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state))
    process = subprocess.Popen([sys.executable, "-m", "stockade", "daemon"], env=env,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not all(answers(state / name) for name in (SOCKET_NAME, "daemon.sock")):
        assert process.poll() is None and time.monotonic() < deadline, "no daemon"
        time.sleep(0.1)
    try:
        yield workspace, state, env
    finally:
        process.terminate()
        process.wait(30)


def answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False


# A client of the CLI server that sends one request (argv as JSON in argv[2], after the program
# facts in argv[3]: FACTS_WORDS) with its own standard streams, and prints the server's answer.
CLI_CLIENT = textwrap.dedent("""
    import json, os, socket, struct, sys
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    argv = [word.encode() for word in [*json.loads(sys.argv[3]), *json.loads(sys.argv[2])]]
    fields = [str(len(argv)).encode(), *argv, os.getcwd().encode(), b"22", b"PATH=/usr/bin:/bin"]
    body = b"".join(field + b"\\0" for field in fields)
    request = struct.pack("<I", len(body)) + body  # (stockade.program.encode_request)
    try:
        s.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
    except BrokenPipeError:
        pass
    answer = b""
    while not answer.endswith(b"\\n") and (chunk := s.recv(64)):
        answer += chunk
    print("ANSWER", repr(answer))
""")

# What a thin program of this interpreter sends before its argv (stockade.cliwire): one the
# server takes for its own (this process has imported what it has not: the tests).
FACTS_WORDS = subprocess.run(
    [sys.executable, "-c", "import json; from stockade.cliwire import FACTS, program_facts; "
     "print(json.dumps([FACTS, *program_facts()]))"], capture_output=True, text=True,
    check=True, env={**os.environ, "PYTHONPATH": REPO}).stdout.strip()

# A client of the daemon that sends one JSON request (argv[2]) and prints every answer line.
DAEMON_CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.sendall(sys.argv[2].encode() + b"\\n")
    data = b""
    while (chunk := s.recv(65536)):
        data += chunk
    print("ANSWER", data.decode())
""")


def answer_of(output: bytes | str) -> str:
    text = output.decode() if isinstance(output, bytes) else output
    lines = [line for line in text.splitlines() if line.startswith("ANSWER ")]
    assert lines, text
    return lines[-1].removeprefix("ANSWER ")


# --- the state directory ------------------------------------------------------------------------

def test_the_state_directory_is_masked_whatever_the_roots_say(daemon):
    """The workspace (a read root) holds the state directory: the sandbox cannot list it,
    read its attestation, or connect to either socket. With the mask switched off it can."""
    workspace, state, _ = daemon
    code = textwrap.dedent(f"""
        import os, socket
        def connect(path):
            socket.socket(socket.AF_UNIX).connect(path)
        for what, attempt in (
                ("list", lambda: os.listdir({str(state)!r})),
                ("read", lambda: open({str(state / "attestation-linux.json")!r}).read()),
                ("cli", lambda: connect({str(state / SOCKET_NAME)!r})),
                ("daemon", lambda: connect({str(state / "daemon.sock")!r}))):
            try:
                attempt()
                print(what, "ok")
            except OSError as exc:
                print(what, exc.errno)
    """)
    masked = run_with(LinuxBackend(), [PYTHON, "-c", code], workspace, name="read-only")
    assert masked.exit_code == 0, masked.stderr
    import errno
    assert masked.stdout.decode().split() == ["list", str(errno.EACCES), "read",
                                              str(errno.EACCES), "cli", str(errno.EACCES),
                                              "daemon", str(errno.EACCES)]
    shown = run_with(LinuxBackend(weaken=frozenset({"stockade_state", "unix_sockets"})),
                     [PYTHON, "-c", code], workspace, name="read-only")
    assert shown.stdout.decode().split() == ["list", "ok", "read", "ok", "cli", "ok",
                                             "daemon", "ok"], shown.stderr


def test_a_root_inside_the_state_directory_is_refused(tmp_path, monkeypatch):
    state = tmp_path / "state"
    (state / "records").mkdir(parents=True)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state))
    with pytest.raises(stockade.PolicyError, match="inside Stockade's state directory"):
        compile_policy(policy_for(read=(str(state / "records"),)), ["true"],
                       CompileContext.current(tmp_path))


# --- the CLI server -----------------------------------------------------------------------------

def test_the_cli_server_serves_no_process_inside_a_sandbox(daemon, tmp_path):
    """F1: with the state directory's mask switched off, a sandboxed command reaches cli.sock
    and asks for a run that writes outside, and for `agent` (an unconfined executor): it is
    told to run them itself, and nothing ran. The same client on the host is served."""
    workspace, state, env = daemon
    outside = tmp_path / "outside"
    outside.mkdir()
    socket_path = str(state / SOCKET_NAME)
    escape = ["run", "--preset", "workspace-write", "--workspace", str(outside), "--", "sh",
              "-c", f"touch {outside}/escaped"]
    for argv in (escape, ["agent"]):
        r = run_with(LinuxBackend(weaken=frozenset({"stockade_state", "unix_sockets"})),
                     [PYTHON, "-c", CLI_CLIENT, socket_path, json.dumps(argv), FACTS_WORDS],
                     workspace,
                     name="read-only")
        assert r.exit_code == 0, r.stderr
        assert answer_of(r.stdout) == repr(NOT_SERVED)
    assert list(outside.iterdir()) == []
    control = subprocess.run([sys.executable, "-c", CLI_CLIENT, socket_path, json.dumps(escape),
                              FACTS_WORDS], capture_output=True, text=True, timeout=60, env=env)
    assert answer_of(control.stdout) == repr(b"0\n"), control.stderr
    assert (outside / "escaped").exists()


def test_the_cli_server_runs_only_the_command_lines_it_serves(daemon, tmp_path):
    """Asked by a client in its own context (the host) for anything but run, sandbox-exec and
    exec, the server runs nothing: `agent` would be an executor outside every sandbox."""
    workspace, state, env = daemon
    made = tmp_path / "made"
    for argv in (["agent"], ["daemon", "--socket", str(tmp_path / "d.sock")],
                 ["--state-dir", str(tmp_path), "run", "--", "touch", str(made)],
                 ["session", "list"], ["reconcile"]):
        done = subprocess.run([sys.executable, "-c", CLI_CLIENT, str(state / SOCKET_NAME),
                               json.dumps(argv), FACTS_WORDS], capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)
        assert answer_of(done.stdout) == repr(NOT_SERVED), (argv, done.stderr)
    assert not made.exists() and not (tmp_path / "d.sock").exists()


# --- the daemon ---------------------------------------------------------------------------------

def test_the_daemon_refuses_a_process_inside_a_sandbox(tmp_path, monkeypatch):
    """F2: a daemon whose socket lies in the workspace (`--socket`), reachable by the command:
    a new session writing outside, and the list of sessions, are both refused, typed. The
    same requests from the host are served."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    path = workspace / "daemon.sock"
    env = {**os.environ, "PYTHONPATH": REPO}
    process = subprocess.Popen([sys.executable, "-m", "stockade", "daemon", "--no-cli-server",
                                "--socket", str(path)], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not answers(path):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        policy = {"version": 1, "preset": "workspace-write",
                  "filesystem": {"read": list(policy_for().filesystem.read)}}
        escape = json.dumps({"op": "exec", "session": "evil", "policy": policy,
                             "workspace": str(outside),
                             "argv": ["sh", "-c", f"echo pwned > {outside}/escaped"]})
        listing = json.dumps({"op": "list"})
        for request in (escape, listing):
            # (the mask of host sockets in roots off: the peer check is what is tested here)
            r = run_with(LinuxBackend(weaken=frozenset({"unix_sockets"})),
                         [PYTHON, "-c", DAEMON_CLIENT, str(path), request], workspace,
                         name="read-only")
            assert r.exit_code == 0, r.stderr
            answer = json.loads(answer_of(r.stdout))
            assert answer["event"] == "error" and answer["code"] == "peer_refused", answer
            assert "namespace" in answer["message"]
        assert list(outside.iterdir()) == []
        control = subprocess.run([sys.executable, "-c", DAEMON_CLIENT, str(path), listing],
                                 capture_output=True, text=True, timeout=60)
        assert json.loads(answer_of(control.stdout))["event"] == "sessions"
    finally:
        process.terminate()
        process.wait(30)


# --- privilege bits -----------------------------------------------------------------------------

PRIVILEGE_BITS = textwrap.dedent("""
    import os, shutil, socket
    shutil.copy("/bin/sh", "copy")
    attempts = {
        "chmod-setuid": lambda: os.chmod("copy", 0o4755),
        "chmod-setgid": lambda: os.chmod("copy", 0o2755),
        "fchmod": lambda: os.fchmod(os.open("copy", os.O_RDONLY), 0o6755),
        "chmod-at": lambda: os.chmod("copy", 0o4755, dir_fd=os.open(".", os.O_RDONLY)),
        "open-creat": lambda: os.close(os.open("made", os.O_CREAT | os.O_WRONLY, 0o4755)),
        "mknod": lambda: os.mknod("node", 0o100000 | 0o4755),
        "file-capability": lambda: os.setxattr("copy", "security.capability",
                                               bytes.fromhex("0000000201000000000000000000000000000000")),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            print(name, "ok")
        except OSError as exc:
            print(name, exc.errno)
    os.chmod("copy", 0o755)
    print("plain-chmod", "ok")
""")


def privileged(workspace: Path) -> list[str]:
    """Files below `workspace` with a setuid or setgid bit or a file capability."""
    found = []
    for entry in workspace.rglob("*"):
        info = entry.lstat()
        caps = None
        if stat.S_ISREG(info.st_mode):
            try:
                caps = os.getxattr(entry, "security.capability", follow_symlinks=False)
            except OSError:
                caps = None
        if info.st_mode & (stat.S_ISUID | stat.S_ISGID) or caps:
            found.append(entry.name)
    return found


def test_no_privilege_bit_can_be_set_in_a_write_root(ws):
    """F3: chmod, fchmod, fchmodat, open(O_CREAT) and mknod with a setuid or setgid mode, and a
    file capability, all fail; on the host no file in the workspace carries one. With the
    seccomp layer off, the mode bits stick (the attempts are real)."""
    workspace, _ = ws
    r = py(PRIVILEGE_BITS, workspace)
    assert r.exit_code == 0, r.stderr
    results = dict(line.split() for line in r.stdout.decode().splitlines())
    assert results.pop("plain-chmod") == "ok"
    assert set(results.values()) == {"1"}, results  # EPERM, every one
    assert privileged(workspace) == []
    for entry in workspace.iterdir():
        entry.unlink()
    weakened = run_with(LinuxBackend(weaken=frozenset({"seccomp"})),
                        [PYTHON, "-c", PRIVILEGE_BITS], workspace)
    assert "chmod-setuid ok" in weakened.stdout.decode(), weakened.stderr


def test_every_mount_of_the_view_is_nosuid_and_nodev(ws):
    workspace, _ = ws
    r = sandbox(["cat", "/proc/self/mountinfo"], workspace, read=(str(workspace),))
    assert r.exit_code == 0, r.stderr
    for line in r.stdout.decode().splitlines():
        point, options = line.split()[4], line.split()[5].split(",")
        if point in ("/", "/proc") or point.startswith("/proc/"):
            continue  # the read-only root tmpfs, and proc (no devices, no setuid files)
        assert "nosuid" in options and ("nodev" in options or point.startswith("/dev")), line


# --- address families and memfd -----------------------------------------------------------------

VSOCK = textwrap.dedent("""
    import socket
    for family in (40, 38, 31, 17):  # AF_VSOCK, AF_ALG, AF_BLUETOOTH, AF_PACKET
        try:
            kind = socket.SOCK_SEQPACKET if family == 38 else socket.SOCK_STREAM
            socket.socket(family, kind).close()
            print(family, "ok")
        except OSError as exc:
            print(family, exc.errno)
""")


@pytest.mark.parametrize("mode", ["none", "allowlist"])
def test_sockets_of_families_a_network_namespace_does_not_isolate_fail(ws, mode):
    """F10: AF_VSOCK (which reaches the hypervisor from any network namespace) and the other
    families outside the allowlist cannot even be created; they are only created, never
    connected. On the host, AF_VSOCK sockets can be created (the attempt is real)."""
    import errno

    workspace, _ = ws
    network = {"network": {"mode": mode, "allow": ["example.test"] if mode == "allowlist"
                           else []}}
    policy = merge(policy_for(), network)
    r = stockade.run([PYTHON, "-c", VSOCK], policy, workspace=workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["40", str(errno.EAFNOSUPPORT), "38",
                                         str(errno.EAFNOSUPPORT), "31",
                                         str(errno.EAFNOSUPPORT), "17",
                                         str(errno.EAFNOSUPPORT)]
    with socket.socket(40, socket.SOCK_STREAM):  # the host can: the attempt is real
        pass


MEMFD_EXEC = textwrap.dedent("""
    import os
    fd = os.memfd_create("payload")
    with open("/bin/true", "rb") as f:
        os.write(fd, f.read())
    try:
        os.execve(fd, ["payload"], {})
    except OSError as exc:
        print("memfd", exc.errno)
""")


def test_exec_from_write_false_holds_against_memfd(ws):
    """F12: a memfd written with a program cannot be executed, root and rootless (the routes
    and each layer alone: test_memfd_exec.py), prepared spares of a template too; with
    exec_from_write = true, or with its layers off, it can (the attempt is real)."""
    import errno

    from stockade.linux.backend import LinuxBackend as Backend

    workspace, _ = ws
    r = py(MEMFD_EXEC, workspace, "workspace-write-no-exec")
    report = {c.name: c for c in Backend().report()}["filesystem.memfd_exec"]
    assert (r.exit_code, r.stdout) == (0, f"memfd {errno.EACCES}\n".encode()), r.stderr
    assert r.enforced["memfd_noexec"] is (os.geteuid() == 0) and r.enforced["memfd_seal"]
    assert report.enforced
    prepared = [py(MEMFD_EXEC, workspace, "workspace-write-no-exec")  # spares of a template too
                for _ in range(6)]
    assert any(p.enforced["prepared_ahead"] for p in prepared)
    assert {p.stdout for p in prepared} == {f"memfd {errno.EACCES}\n".encode()}
    allowed = py(MEMFD_EXEC, workspace, exec_from_write=True)
    assert (allowed.exit_code, allowed.stdout) == (0, b""), allowed.stderr
    weakened = run_with(LinuxBackend(weaken=frozenset({"memfd_noexec", "memfd_seal",
                                                       "exec_watch"})),
                        [PYTHON, "-c", MEMFD_EXEC], workspace, name="workspace-write-no-exec")
    assert (weakened.exit_code, weakened.stdout) == (0, b""), weakened.stderr


def test_openat2_answers_enosys_so_callers_fall_back(ws):
    """openat2 carries its mode in a struct no filter can read: it is ENOSYS, the answer on
    which every caller falls back to openat (whose mode is checked)."""
    import errno

    workspace, _ = ws
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.syscall(437, -100, b'.', None, 0), ctypes.get_errno())")
    r = py(code, workspace)
    assert r.stdout.decode().split() == ["-1", str(errno.ENOSYS)], r.stderr


# --- deny ---------------------------------------------------------------------------------------

def test_deny_holds_when_a_read_root_is_the_whole_tree(ws):
    """read = ["/"]: the denied paths are still masked, /proc is the sandbox's own and /tmp
    is its own (they once lay under the root's mount, unseen, with the host's showing)."""
    workspace, outside = ws
    (outside / "secret").write_text("TOPSECRET")
    marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    (Path("/tmp") / marker).write_text("host tmp")
    try:
        r = sandbox(["sh", "-c", f"cat {outside}/secret; echo; ls /tmp/{marker}; "
                                 "readlink /proc/1/exe; ls /proc | grep -c '^[0-9]'"],
                    workspace, read=("/",), deny=(str(outside),))
    finally:
        (Path("/tmp") / marker).unlink()
    assert b"TOPSECRET" not in r.stdout
    assert b"host tmp" not in r.stdout and b"No such file or directory" in r.stderr
    assert int(r.stdout.split()[-1]) < 10  # the sandbox's few processes, not the host's


def test_default_denies_cover_credential_backups_and_private_keys(ws):
    workspace, _ = ws
    deny = stockade.preset("workspace-write").filesystem.deny
    assert {"/etc/shadow-", "/etc/gshadow-", "/etc/ssl/private",
            "/etc/security/opasswd"} <= set(deny)
    r = sandbox(["sh", "-c", "cat /etc/shadow- /etc/gshadow-; ls /etc/ssl/private"], workspace)
    assert r.exit_code != 0 and b"root:" not in r.stdout
    if os.path.exists("/etc/security/opasswd"):  # (old passwords' hashes: as root, readable)
        r = sandbox(["cat", "/etc/security/opasswd"], workspace)
        assert r.exit_code != 0 and b"Permission denied" in r.stderr and not r.stdout


def test_an_absent_denied_path_inside_a_write_root_is_refused(ws):
    """F9: a denied path that does not exist inside a write root could be created by the
    command (`~/.aws/config` with workspace = $HOME): the launch is refused, naming it, and
    nothing is created."""
    workspace, _ = ws
    with pytest.raises(stockade.UnenforceableError) as refused:
        sandbox(["sh", "-c", "mkdir .aws && echo x > .aws/config"], workspace,
                deny=(str(workspace / ".aws"),))
    assert refused.value.code == "unenforceable:filesystem.deny"
    assert str(workspace / ".aws") in refused.value.message
    assert not (workspace / ".aws").exists()
    (workspace / ".aws").mkdir()  # the way out the message names
    r = sandbox(["sh", "-c", "echo x > .aws/config"], workspace, deny=(str(workspace / ".aws"),))
    assert r.exit_code != 0 and list((workspace / ".aws").iterdir()) == []


def test_every_absent_denied_path_is_named_in_one_refusal_with_one_command(ws):
    """Issue 32: the preset run from a home directory used as the workspace was refused once
    per absent denied path (11 runs to find them all). One refusal names every one, with one
    command that makes them all; once it has run, the preset runs, and the denied paths it
    made (a directory, a credential file) stay out of reach."""
    workspace, _ = ws
    deny = tuple(path.replace("{home}", str(workspace))
                 for path in stockade.preset("workspace-write").filesystem.deny
                 if path.startswith("{home}/"))
    with pytest.raises(stockade.UnenforceableError) as refused:
        sandbox(["true"], workspace, deny=deny)
    assert refused.value.code == "unenforceable:filesystem.deny"
    message = refused.value.message
    assert all(path in message for path in deny) and len(deny) == 11
    command = message.split(", with ", 1)[1].split("), or choose", 1)[0] + ")"
    assert list(workspace.iterdir()) == []  # the refusal made nothing
    subprocess.run(["sh", "-c", command], check=True)
    assert (workspace / ".ssh").is_dir() and (workspace / ".netrc").is_file()
    assert oct((workspace / ".config" / "gh").stat().st_mode & 0o777) == "0o700"
    r = sandbox(["sh", "-c", "cat .netrc; ls .ssh; echo planted > .ssh/id_rsa; echo ran"],
                workspace, deny=deny)
    assert r.stdout.strip() == b"ran", r.stderr
    assert b"Permission denied" in r.stderr
    assert list((workspace / ".ssh").iterdir()) == [] and (workspace / ".netrc").stat().st_size == 0


# --- links a sandbox could have planted -----------------------------------------------------------

def test_a_write_root_reached_through_a_planted_link_is_refused(ws):
    """F13: `ln -s $HOME build` planted in the workspace by an earlier run; a later grant of
    `build` would make the link's target writable: refused, naming the link. The same
    target granted directly is honoured."""
    workspace, outside = ws
    (workspace / "build").symlink_to(outside)
    with pytest.raises(stockade.UnenforceableError) as refused:
        sandbox(["sh", "-c", "echo pwned > build/escaped"], workspace,
                write=(str(workspace), str(workspace / "build")))
    assert refused.value.code == "unenforceable:filesystem.symlink"
    assert str(workspace / "build") in refused.value.message
    assert list(outside.iterdir()) == []
    r = sandbox(["sh", "-c", f"echo ok > {outside}/made"], workspace,
                write=(str(workspace), str(outside)))
    assert r.exit_code == 0 and (outside / "made").read_text() == "ok\n"


def test_a_write_root_that_is_a_link_inside_a_read_root_is_refused(ws):
    """A link `src -> outside` in a read-only workspace, granted write: refused."""
    workspace, outside = ws
    (workspace / "src").symlink_to(outside)
    with pytest.raises(stockade.UnenforceableError, match="symbolic link"):
        sandbox(["true"], workspace, "read-only", write=(str(workspace / "src"),))
    assert list(outside.iterdir()) == []


def test_a_write_root_inside_a_protected_name_is_honoured(ws):
    """An exact grant inside a protected name wins: `.codex/x` granted write is writable,
    while `.codex` itself stays read-only."""
    workspace, _ = ws
    (workspace / ".codex" / "x").mkdir(parents=True)
    r = sandbox(["sh", "-c", "echo ok > .codex/x/made && echo bad > .codex/evil"], workspace,
                write=(str(workspace), str(workspace / ".codex" / "x")))
    assert (workspace / ".codex" / "x" / "made").read_text() == "ok\n", r.stderr
    assert not (workspace / ".codex" / "evil").exists()


# --- the caller's streams -----------------------------------------------------------------------

def cli(*args: str, **options) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_NO_SERVER": "1"}
    return subprocess.run([sys.executable, "-m", "stockade", *args], env=env, timeout=120,
                          **options)


TERMINAL_PROBE = textwrap.dedent("""
    import os, termios
    print("isatty", [os.isatty(fd) for fd in (0, 1, 2)], flush=True)
    for fd in (0, 1, 2):
        try:
            termios.tcsetattr(fd, termios.TCSANOW, [0, 0, 0, 0, 0, 0, [b"\\0"] * 32])
            print("tcsetattr", fd, "ok")
        except (OSError, termios.error):
            print("tcsetattr", fd, "refused")
    try:
        os.open("/dev/tty", os.O_RDWR)
        print("devtty ok")
    except OSError:
        print("devtty refused")
    try:
        print("read", os.read(1, 100))
    except OSError:
        print("read refused")
""")


@pytest.mark.parametrize("stdin", ["null", "inherit"])
def test_the_host_terminal_never_enters_the_sandbox(ws, tmp_path, stdin):
    """F7: run from a terminal, the command's streams are pipes: it cannot change the
    terminal's settings or read what the user types on it (with stdin = "null", typed input
    stays for the shell; with "inherit" it arrives through the pipe, as input)."""
    import pty
    import termios

    workspace, _ = ws
    policy = tmp_path / "policy.json"
    read = list(policy_for().filesystem.read)
    policy.write_text(json.dumps({"version": 1, "preset": "workspace-write",
                                  "filesystem": {"read": read}, "process": {"stdin": stdin}}))
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    os.write(master, b"typed-secret\n")
    script = TERMINAL_PROBE + ("\nimport sys\nprint('got', sys.stdin.readline().strip())"
                               if stdin == "inherit" else "")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "stockade", "run", "--policy", str(policy), "--workspace",
             str(workspace), "--", PYTHON, "-c", script], stdin=slave, stdout=slave,
            stderr=slave, env={**os.environ, "PYTHONPATH": REPO, "STOCKADE_NO_SERVER": "1"},
            timeout=120, start_new_session=True)
        after = termios.tcgetattr(slave)
        os.set_blocking(master, False)
        seen = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(master, 65536):
                seen += chunk
        left = b""
        if stdin == "null":
            os.set_blocking(slave, False)
            with contextlib.suppress(BlockingIOError):
                left = os.read(slave, 100)
    finally:
        os.close(master)
        os.close(slave)
    text = seen.decode(errors="replace")
    assert done.returncode == 0, text
    assert "isatty [False, False, False]" in text
    assert "tcsetattr 0 ok" not in text and "tcsetattr 1 ok" not in text
    assert "devtty refused" in text and "read refused" in text
    assert after == before  # the terminal's settings are untouched
    if stdin == "null":
        assert left == b"typed-secret\n"  # still there for the shell, never read
    else:
        assert "got typed-secret" in text


def test_the_output_limit_holds_on_the_command_line(ws, tmp_path):
    """F14: output passed through the command line is cut at limits.output too, and said."""
    workspace, _ = ws
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"version": 1, "preset": "workspace-write",
                                  "filesystem": {"read": list(policy_for().filesystem.read)},
                                  "limits": {"output": "64KiB"}}))
    done = cli("run", "--policy", str(policy), "--workspace", str(workspace), "--", "head",
               "-c", "20000000", "/dev/zero", capture_output=True)
    assert done.returncode == 0
    assert len(done.stdout) == 64 << 10
    assert b"limits.output" in done.stderr


def test_a_host_file_the_output_goes_to_cannot_be_truncated(ws, tmp_path):
    """F15: `>> host.log`: the command's stdout is a pipe, not the file, so ftruncate fails
    and the log keeps what it had."""
    workspace, _ = ws
    log = tmp_path / "host.log"
    log.write_text("earlier lines\n")
    with open(log, "a") as appended:
        done = cli("run", "--preset", "workspace-write", "--workspace", str(workspace), "--",
                   PYTHON, "-c", "import os\ntry:\n    os.ftruncate(1, 0)\n"
                   "except OSError as exc:\n    print(exc.errno)\nprint('new')",
                   stdout=appended, stderr=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    import errno
    assert log.read_text() == f"earlier lines\n{errno.EINVAL}\nnew\n"


# --- unix sockets in granted roots ----------------------------------------------------------------

UNIX_CLIENT = textwrap.dedent("""
    import os, socket, sys
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(sys.argv[1])
        s.sendall(b"from the sandbox")
        print("connected")
    except OSError as exc:
        print("refused", exc.errno)
    try:  # its own socket, in the workspace
        own = socket.socket(socket.AF_UNIX)
        own.bind("own.sock")
        own.listen(1)
        peer = socket.socket(socket.AF_UNIX)
        peer.connect("own.sock")
        print("own ok")
    except OSError as exc:
        print("own refused", exc.errno)
    a, b = socket.socketpair()
    a.sendall(b"x")
    print("pair", b.recv(1).decode())
""")


@pytest.fixture
def host_socket(ws):
    """A host process listening on a socket file inside the workspace (a dev server, an
    agent): (path, the bytes it received)."""
    import threading

    workspace, _ = ws
    path = workspace / "host.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(4)
    listener.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    received.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, received
    stop.set()
    thread.join(5)
    listener.close()


@pytest.mark.parametrize("mode", ["own", "any", "none"])
def test_unix_sockets_in_a_write_root(ws, host_socket, mode):
    """network.unix_sockets: "own" (default) masks a socket a host process listens on in a
    write root, and the command's own sockets work; "any" reaches it (the attempt is real);
    "none" makes no AF_UNIX socket at all (socketpair still works)."""
    import errno

    workspace, _ = ws
    path, received = host_socket
    policy = merge(policy_for(), {"network": {"unix_sockets": mode}}) if mode != "own" \
        else policy_for()
    r = stockade.run([PYTHON, "-c", UNIX_CLIENT, str(path)], policy, workspace=workspace)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    deadline = time.monotonic() + (10 if mode == "any" else 0.3)
    while not received and time.monotonic() < deadline:  # (what arrives, it reads by then)
        time.sleep(0.02)
    if mode == "any":
        assert lines[0] == "connected" and lines[1] == "own ok"
        assert received == [b"from the sandbox"]
    elif mode == "own":
        assert lines[0] in (f"refused {errno.ECONNREFUSED}", f"refused {errno.EACCES}")
        assert lines[1] == "own ok" and received == []
    else:
        assert lines[:2] == [f"refused {errno.EACCES}", f"own refused {errno.EACCES}"]
        assert received == []
    assert lines[2] == "pair x"
    if mode == "own":  # the mask is the layer: without it, the host server is reached
        weakened = run_with(LinuxBackend(weaken=frozenset({"unix_sockets"})),
                            [PYTHON, "-c", UNIX_CLIENT, str(path)], workspace)
        assert weakened.stdout.decode().splitlines()[0] == "connected"
