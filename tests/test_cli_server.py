"""The CLI server (`stockade daemon` serves `stockade run`): the same command line, run by a
child of the server with the client's directory, environment and streams, ending with its
client; and the ordinary command line whenever no server answers."""

from __future__ import annotations

import _socket
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
from conftest import interrupted_json_run, marked

from stockade import program
from stockade.cliwire import program_facts
from stockade.lifecycle import homes, statedir
from stockade.program import NOT_SERVED, SOCKET_NAME, encode_request

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]
REPO = str(Path(__file__).resolve().parent.parent)


def stockade(*args: str, env: dict, cwd: Path, **options) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, **options)


@pytest.fixture
def served(tmp_path):
    """(environment whose state directory has a serving daemon, the daemon's pid)."""
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(state)}
    daemon = subprocess.Popen([sys.executable, "-m", "stockade", "daemon", "--socket",
                               str(tmp_path / "daemon.sock")], env=env,
                              stderr=subprocess.DEVNULL)
    path = str(state / SOCKET_NAME)
    deadline = time.monotonic() + 60
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
                break
            except OSError:
                assert daemon.poll() is None and time.monotonic() < deadline, "no CLI server"
                time.sleep(0.1)
    try:
        yield env, daemon.pid
    finally:
        daemon.terminate()
        daemon.wait(30)
    assert not os.path.exists(path)  # the daemon removed its server's socket


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "ws"
    (path / "sub").mkdir(parents=True)
    return path


def test_a_served_run_is_the_same_command_line(served, workspace):
    env, _ = served
    script = "echo out; echo err >&2; pwd; touch /usr/nope; exit 7"
    args = ("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh", "-c", script)
    through = stockade(*args, env=env, cwd=workspace)
    here = stockade(*args, env={**env, "STOCKADE_NO_SERVER": "1"}, cwd=workspace)
    assert through.returncode == here.returncode == 7
    assert through.stdout == here.stdout == f"out\n{workspace}\n"
    assert through.stderr == here.stderr and through.stderr.startswith("err\n")
    result = json.loads(stockade(*args[:-4], "--json", "--", "cat", "/etc/shadow", env=env,
                                 cwd=workspace).stdout)
    assert result["exit_code"] != 0 and result["backend"] == "linux"
    refused = stockade("run", "--preset", "no-such", "--", "true", env=env, cwd=workspace)
    assert refused.returncode == 2 and refused.stderr.startswith("stockade: policy_invalid: ")
    assert len(refused.stderr.splitlines()) == 1


def test_the_clients_directory_environment_and_stdin_are_used(served, workspace):
    env, _ = served
    policy = workspace / "policy.json"
    policy.write_text(json.dumps({"version": 1, "preset": "workspace-write",
                                  "env": {"pass": ["FOO"]}, "process": {"stdin": "inherit"}}))
    done = stockade("run", "--policy", str(policy), "--workspace", "..", "--", "sh", "-c",
                    'echo "$FOO"; pwd; cat', env={**env, "FOO": "from-client"},
                    cwd=workspace / "sub", input="piped\n")
    assert done.returncode == 0, done.stderr
    # the default cwd is the workspace, which `..` made the client's parent directory
    assert done.stdout == f"from-client\n{workspace}\npiped\n"


def test_the_clients_umask_is_the_commands(served, workspace):
    env, _ = served
    for umask, mode in ((0o077, "600"), (0o022, "644"), (0o077, "600")):
        made = workspace / f"made-{umask:o}-{mode}"
        done = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh",
                        "-c", f"umask; touch {made.name}", env=env, cwd=workspace,
                        preexec_fn=lambda u=umask: os.umask(u))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{umask:04o}"
        assert f"{made.stat().st_mode & 0o777:o}" == mode
        made.unlink()


def test_the_command_runs_under_the_server_and_ends_with_its_client(served, workspace):
    env, _ = served
    marker = f"3{time.monotonic_ns() % 10**9}"
    client = subprocess.Popen([sys.executable, "-m", "stockade", "run", "--", "sleep", marker],
                              env=env, cwd=workspace, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not (sleeping := [p for p in marked(marker) if p != client.pid]):
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    # A sandbox's owner holds its lifeline and status pipes; this client holds no pipe at all.
    assert not pipes_of(client.pid)
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 10
    while any(pid in marked(marker) for pid in sleeping):
        assert time.monotonic() < deadline, "the sandbox outlived its client"
        time.sleep(0.05)


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_a_served_json_run_on_ctrl_c_prints_the_cancelled_result(served, workspace, sigint):
    """Issue 32: the client's Ctrl-C reaches the command line in the server (CANCEL), which
    cancels the command and prints its Result, as it would run here; also from a client that
    inherited SIGINT ignored (as run here: `run --json` takes SIGINT itself)."""
    env, _ = served
    status, result = interrupted_json_run(env, workspace, sigint)
    assert status == 130
    assert result["cancelled"] is True and result["stdout"] == "started\n"


@pytest.mark.parametrize("served_here", [True, False], ids=["served", "here"])
def test_a_run_that_inherited_sigint_ignored_goes_on_through_one(request, workspace,
                                                                 served_here):
    """A script's background job ignores SIGINT (the terminal's Ctrl-C is for the job in the
    foreground): `stockade run` without --json then ends as if none came, served as here."""
    env = (request.getfixturevalue("served")[0] if served_here
           else {**os.environ, "PYTHONPATH": REPO, "STOCKADE_NO_SERVER": "1"})
    marker = f"1.{time.monotonic_ns() % 10**9}"
    client = subprocess.Popen([sys.executable, "-m", "stockade", "run", "--", "sh", "-c",
                               f"sleep {marker}; echo ran-on"], env=env, cwd=workspace,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 20
    while not marked(f"sleep\0{marker}"):
        assert time.monotonic() < deadline and client.poll() is None, "it never started"
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)
    client.send_signal(signal.SIGINT)  # (a second too: the client left on one before)
    out, err = client.communicate(timeout=30)
    assert (client.returncode, out) == (0, b"ran-on\n"), err


def test_a_client_with_other_resource_limits_runs_its_command_itself(served, workspace):
    """A served run would take the server's resource limits: a client whose limits differ
    is not served, and its command gets the client's own (here a lower RLIMIT_NOFILE)."""
    env, _ = served
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(soft, hard) // 2
    done = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh", "-c",
                    "ulimit -n", env=env, cwd=workspace,
                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard)))
    assert (done.returncode, done.stdout) == (0, f"{lower}\n"), done.stderr
    same = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh", "-c",
                    "ulimit -n", env=env, cwd=workspace)
    assert (same.returncode, same.stdout) == (0, f"{soft}\n"), same.stderr


def test_a_client_in_other_namespaces_runs_its_command_itself(served, workspace):
    """A client in a user and mount namespace of its own, where a tmpfs covers a directory
    of its workspace, passes the peer check (its uid maps to the server's) but is not served:
    its command sees the client's mounts, not the server's."""
    env, _ = served
    script = (f"mount -t tmpfs none sub && touch sub/only-here && exec {sys.executable} -m "
              "stockade run --preset workspace-write --workspace . -- ls sub")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script], env=env, cwd=workspace, capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, "only-here\n"), done.stderr


def pipes_of(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("pipe:"):
                found.add(target)
    return found


def test_without_an_answering_server_the_run_happens_here(tmp_path, workspace):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(state / SOCKET_NAME))  # bound, never listening: a dead server's
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(state)}
    done = stockade("run", "--", "sh", "-c", "echo here", env=env, cwd=workspace)
    stale.close()
    assert (done.returncode, done.stdout) == (0, "here\n"), done.stderr


def _one_connection(path: Path, take: int, answer: bytes) -> tuple[threading.Thread,
                                                                    threading.Event]:
    """A stand-in server: accepts once, reads `take` bytes, sends `answer` and closes (then
    sets the event it returns)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)
    closed = threading.Event()

    def serve() -> None:
        with listener, listener.accept()[0] as conn:
            got = b""
            while len(got) < take and (chunk := conn.recv(take - len(got))):
                got += chunk
            conn.sendall(answer)
        closed.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    return server, closed


def test_a_server_that_answers_at_once_is_heard(tmp_path, monkeypatch):
    """A request that fits in one send, answered and closed by the server before the client
    looks again (as a refused policy is): the client reports that status. It once sent the
    empty rest of its request after that, and died of a broken pipe."""
    path = tmp_path / SOCKET_NAME
    monkeypatch.setattr(program, "socket_path", lambda: str(path))
    for name in list(os.environ):
        monkeypatch.delenv(name)
    umask = os.umask(0o22)
    os.umask(umask)
    request = encode_request(["run", "--", "true"], os.getcwd(), umask, {}, program_facts())
    server, closed = _one_connection(path, len(request), b"2\n")

    class Slow(_socket.socket):
        def sendmsg(self, *args):
            sent = super().sendmsg(*args)
            assert closed.wait(10)
            return sent

    monkeypatch.setattr(program, "_socket", types.SimpleNamespace(**{
        name: getattr(_socket, name) for name in dir(_socket) if name.isupper()}, socket=Slow))
    assert program._through_server(["run", "--", "true"]) == 2
    server.join(10)


def test_a_server_gone_before_the_whole_request_means_the_run_happens_here(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / SOCKET_NAME
    monkeypatch.setattr(program, "socket_path", lambda: str(path))
    monkeypatch.setenv("STOCKADE_TEST_BULK", "x" * (4 << 20))  # more than a socket buffer
    server, _ = _one_connection(path, 64, b"")
    assert program._through_server(["run", "--", "true"]) is None
    server.join(10)


@pytest.mark.root_only("needs root to mount on the host")
def test_a_prepared_sandbox_sees_a_mount_made_after_it(served, workspace, tmp_path):
    env, _ = served
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "stockade-test", str(mount_point)], check=True)
    try:
        (mount_point / "on-the-mount").write_text("x")
        done = stockade("run", "--read", str(mount_point), "--", "ls", str(mount_point),
                        env=env, cwd=workspace)
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
    assert (done.returncode, done.stdout) == (0, "on-the-mount\n"), done.stderr


def test_served_runs_of_one_policy_use_prepared_sandboxes_that_see_host_changes(served,
                                                                               workspace):
    """Each spare child's sandbox is prepared for the view of the last request that launched:
    from the third request of one policy on, the sandbox was ready before it came. A protected
    name made between two requests is still protected: the survey no longer matches."""
    env, _ = served
    args = ("run", "--preset", "workspace-write", "--workspace", ".", "--json", "--")

    def enforced(*argv: str) -> dict:
        done = stockade(*args, *argv, env=env, cwd=workspace)
        return json.loads(done.stdout)["enforced"]

    def settled() -> bool:
        """A request's answer, once the spare its predecessor left had time to be made: it is
        prepared after a launch, off its path, so on a loaded machine a request may come
        first (and rightly find none ready: asked again after a longer pause)."""
        for pause in (1, 3, 6):
            time.sleep(pause)
            if enforced("true")["prepared_ahead"]:
                return True
        return False

    prepared = [enforced("true")["prepared_ahead"]]
    prepared += [settled() for _ in range(3)]
    assert prepared[2:] == [True, True]
    # Another workspace's first run makes its private home beside this one's: the homes'
    # directory, masked in the view, changed, and the spare is still this request's (it was
    # never used in a run of both suites at once, whose launches make homes all the time)
    other = homes.home_for(str(workspace.parent / "another-workspace"), statedir.key_dir())
    homes.ensure(other)
    try:
        assert settled()
    finally:
        homes.discard(str(workspace.parent / "another-workspace"), statedir.key_dir())
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    done = stockade(*args[:-2], "--", "sh", "-c", "echo evil >> .git/config", env=env,
                    cwd=workspace)
    assert done.returncode != 0
    assert (workspace / ".git" / "config").read_text() == "[core]\n"


@pytest.mark.root_only("needs root to connect as another user")
def test_another_user_is_not_served(served, workspace, tmp_path):
    env, _ = served
    state = Path(env["STOCKADE_STATE_DIR"])
    opened = [p for p in (state, *state.parents) if p.is_relative_to(tmp_path.parents[2])]
    modes = {p: p.stat().st_mode & 0o7777 for p in opened}
    request = encode_request(["run", "--", "touch", str(workspace / "made")], "/", 0o22, {},
                             program_facts())
    code = textwrap.dedent("""
        import os, socket, struct, sys
        os.setgid(65534)
        os.setuid(65534)
        s = socket.socket(socket.AF_UNIX)
        s.connect(sys.argv[1])
        try:  # (refused at once, maybe before it sends)
            s.sendmsg([bytes.fromhex(sys.argv[2])],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        except BrokenPipeError:
            pass
        print(repr(s.recv(16)))
    """)
    try:
        for directory, mode in modes.items():
            os.chmod(directory, mode | 0o111)  # (search only: the temp dir itself keeps its mode)
        os.chmod(state / SOCKET_NAME, 0o666)  # only the peer check stands in the way now
        done = subprocess.run([sys.executable, "-c", code, str(state / SOCKET_NAME),
                               request.hex()], capture_output=True, text=True, timeout=30)
    finally:
        for directory, mode in modes.items():
            os.chmod(directory, mode)
    # Not served: told to run it itself, as itself (the server ran nothing).
    assert (done.returncode, done.stdout) == (0, f"{NOT_SERVED!r}\n"), done.stderr
    assert not (workspace / "made").exists()


SPARE_OF_A_GONE_SERVER = """
import os, socket, sys, time
from stockade.cli import COMMAND_LINE, server
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen()
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:  # its server ends before it has set its death signal
        time.sleep(0.01)
    _, taken_w = os.pipe()
    server._spare(listener, taken_w, COMMAND_LINE.main, server.fork_directly(), None, True,
                  parent)
os._exit(0)
"""


@pytest.mark.usefixtures("linux")
def test_a_spare_whose_server_ended_as_it_was_forked_ends_too(tmp_path):
    """A spare the server forks just before it dies sets its death signal too late to get
    it; it must see its server is gone and end, never wait on the listener for ever (how a
    `stockade daemon` was once left running, orphaned, after a run of the suite)."""
    path = str(tmp_path / f"cli-{os.getpid()}-{time.monotonic_ns()}.sock")
    subprocess.run([sys.executable, "-c", SPARE_OF_A_GONE_SERVER, path], check=True,
                   env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    deadline = time.monotonic() + 10
    while marked(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked(path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "the spare outlived its server"
