"""The CLI server a run starts by itself (stockade/cli/autoserver.py): a run that found none
starts one, which serves the next runs of its user in its context and cgroup, holds nothing of
the run that started it, imports nothing from that run's working directory, and ends by itself
when unused."""

from __future__ import annotations

import _socket
import contextlib
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import marked

from stockade.cli.autoserver import IDLE_ENV, IDLE_MOST, idle_seconds
from stockade.program import SOCKET_NAME

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]
REPO = str(Path(__file__).resolve().parent.parent)
PROGRAM = os.path.join(REPO, "bin", "stockade")


@pytest.fixture
def state(tmp_path):
    """A state directory of this test's own; whatever server starts there is ended after."""
    path = tmp_path / "state"
    yield path
    server = _server_pid(path)
    if server is None:
        return
    group = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
             if _group_of(pid) == server]  # it, its spare and the spare's sandbox
    pidfds = [os.pidfd_open(pid) for pid in group if _group_of(pid) == server]
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, signal.SIGKILL)
        for pidfd in pidfds:
            assert select.select([pidfd], [], [], 30)[0], "a server's process did not end"
    finally:
        for pidfd in pidfds:
            os.close(pidfd)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def _env(state: Path, idle: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(state), IDLE_ENV: idle}


def _run(*command: str, env: dict, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The program as installed (a script), not `python -m`, which puts the cwd on the path.
    return subprocess.run([sys.executable, PROGRAM, "run", "--preset", "workspace-write",
                           "--", *command], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def _server_pid(state: Path) -> int | None:
    """The pid of what listens on the state directory's CLI socket, as the kernel says."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(state / SOCKET_NAME))
        except OSError:
            return None
        creds = probe.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return struct.unpack("3i", creds)[0]


def _wait_for_server(state: Path) -> int:
    deadline = time.monotonic() + 60
    while (pid := _server_pid(state)) is None:
        assert time.monotonic() < deadline, "no server was started"
        time.sleep(0.1)
    return pid


def _ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as info:
            pid = int(info.read().rsplit(b")", 1)[1].split()[1])
        found.append(pid)
    return found


def _runs_under(env: dict, cwd: Path, marker: str, prefix: list[str] | None = None,
                program: list[str] | None = None) -> list[int]:
    """The host ancestors of a `sleep` the run of a client started (then ended)."""
    client = subprocess.Popen([*(prefix or []), *(program or [sys.executable, PROGRAM]), "run",
                               "--preset",
                               "workspace-write", "--", "sleep", marker], env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (sleeping := [pid for pid in marked(f"sleep\0{marker}")
                                if pid != client.pid]):
            assert time.monotonic() < deadline and client.poll() is None, "it never started"
            time.sleep(0.05)
        return _ancestors(sleeping[0])
    finally:
        client.kill()
        client.wait()
        deadline = time.monotonic() + 10  # (its sandbox, and a run it forked, end with it)
        while marked(marker):
            assert time.monotonic() < deadline, "a run outlived its client"
            time.sleep(0.05)


def test_a_run_that_found_no_server_starts_one_that_serves_the_next(state, workspace):
    env = _env(state, "600")
    first = _run("sh", "-c", "echo first; exit 3", env=env, cwd=workspace)
    # (capture_output returned: the server it started holds none of the run's streams)
    assert (first.returncode, first.stdout) == (3, "first\n"), first.stderr
    server = _wait_for_server(state)
    assert os.getsid(server) == server  # out of the caller's session: its Ctrl-C is not ours
    assert os.readlink(f"/proc/{server}/cwd") == "/"  # it keeps no workspace busy
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{server}/fd/{fd}") == os.devnull
    assert server in _runs_under(env, workspace, f"4{time.monotonic_ns() % 10**9}")
    second = _run("sh", "-c", "echo second; exit 4", env=env, cwd=workspace)
    assert (second.returncode, second.stdout) == (4, "second\n"), second.stderr
    assert _server_pid(state) == server  # served, not replaced


def test_the_server_ends_by_itself_when_unused(state, workspace):
    env = _env(state, "2")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    pidfd = os.pidfd_open(server)
    try:
        assert _run("true", env=env, cwd=workspace).returncode == 0  # (served: it waits again)
        assert select.select([pidfd], [], [], 30)[0], "the server did not end when unused"
    finally:
        os.close(pidfd)
    assert not (state / SOCKET_NAME).exists()


def test_a_command_exiting_2_starts_one_and_help_or_a_usage_error_none(state, workspace):
    """A server serves the next run: one is started after a sandbox ran, whatever the
    command's status (2 is a command's as much as a usage error's), and never after
    `--help`, a usage error or a refusal, which launched nothing."""
    env = _env(state, "600")
    for words, status in ((["--help"], 0), (["--no-such-flag", "--", "true"], 2),
                          (["--preset", "no-such-preset", "--", "true"], 2)):
        done = subprocess.run([sys.executable, PROGRAM, "run", *words], env=env, cwd=workspace,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == status, done.stderr
    time.sleep(1)
    assert _server_pid(state) is None and not (state / SOCKET_NAME).exists()
    assert _run("sh", "-c", "exit 2", env=env, cwd=workspace).returncode == 2
    assert _wait_for_server(state)


def test_idle_zero_starts_no_server(state, workspace):
    env = _env(state, "0")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    time.sleep(1)
    assert _server_pid(state) is None and not (state / SOCKET_NAME).exists()


def test_the_callers_working_directory_is_not_on_the_servers_import_path(state, workspace):
    """A run's working directory may be a workspace a sandbox wrote: a `stockade` package
    planted there must not be what the started server imports (it would run unsandboxed)."""
    planted = workspace / "stockade" / "cli"
    planted.mkdir(parents=True)
    touched = workspace.parent / "planted-ran"
    (workspace / "stockade" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "autoserver.py").write_text(f"open({str(touched)!r}, 'w').close()\n")
    assert _run("true", env=_env(state, "600"), cwd=workspace).returncode == 0
    deadline = time.monotonic() + 60
    while _server_pid(state) is None and not touched.exists():
        assert time.monotonic() < deadline, "no server was started"
        time.sleep(0.1)
    assert not touched.exists()


def _other_cgroup(tmp_path: Path) -> Path:
    """A new cgroup below this process's own memory (v1) or unified (v2) cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        base = {"memory": "/sys/fs/cgroup/memory", "": "/sys/fs/cgroup"}.get(controllers)
        if base is not None and os.access(f"{base}{path}/cgroup.procs", os.W_OK):
            made = Path(f"{base}{path.rstrip('/')}/stockade-test-{tmp_path.name}-{os.getpid()}")
            made.mkdir()
            return made
    # (root on Linux can make one below its own memory or unified cgroup: a host where it
    # cannot fails here, saying why, rather than pass this guarantee unshown)
    pytest.fail("no cgroup of this process's own can be made here (a memory v1 or v2 one)")


@pytest.mark.root_only(reason="making a cgroup to move a client into needs root here")
def test_a_client_in_another_cgroup_is_not_served(state, workspace, tmp_path):
    """Its runs would take the server's cgroup (and its limits), which nobody chose for them:
    it runs the command line itself."""
    env = _env(state, "600")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    cgroup = _other_cgroup(tmp_path)
    try:
        moved = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"]
        ancestors = _runs_under(env, workspace, f"5{time.monotonic_ns() % 10**9}", moved)
        assert server not in ancestors
        assert _server_pid(state) == server  # (and no second server replaced it)
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                cgroup.rmdir()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)


def test_a_relative_import_path_entry_of_the_caller_names_nothing_of_its_directory(state,
                                                                                   workspace):
    """Attack A1: PYTHONPATH's relative entries (and "") are joined to the directory the
    server starts in; started in the caller's, perhaps a workspace, they would put it on the
    import path of a process that runs unsandboxed for ten minutes."""
    ran = workspace.parent / "sitecustomize-ran"
    (workspace / "lib").mkdir()
    (workspace / "lib" / "sitecustomize.py").write_text(
        "import sys\n"
        "if 'stockade.cli.autoserver' in sys.orig_argv:\n"
        f"    open({str(ran)!r}, 'w').close()\n")
    env = {**_env(state, "600"), "PYTHONPATH": os.pathsep.join(["lib", REPO])}
    assert _run("true", env=env, cwd=workspace).returncode == 0
    _wait_for_server(state)
    assert not ran.exists()


def test_the_server_holds_no_descriptor_of_the_run_that_started_it(state, workspace):
    """Attack A8: a descriptor the caller inherited (`$(stockade run ... 3>&1)`, a `flock 9`
    guard) is not held open by the server it starts."""
    read, write = os.pipe()
    try:
        first = subprocess.run([sys.executable, PROGRAM, "run", "--preset", "workspace-write",
                                "--", "true"], env=_env(state, "600"), cwd=workspace,
                               pass_fds=(write,), capture_output=True, timeout=60)
        assert first.returncode == 0, first.stderr
        os.close(write)
        write = -1
        _wait_for_server(state)
        assert select.select([read], [], [], 10)[0] and os.read(read, 1) == b""
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_a_served_run_keeps_its_clients_own_code_read_only(state, workspace):
    """Attack A11: the client's own script in the workspace (the `stockade` it was started
    as) stays read-only in a served run as in a run of its own: the server's child judges the
    client's host code, not the server's."""
    script = workspace / "bin" / "stockade"
    script.parent.mkdir()
    shutil.copy(PROGRAM, script)
    before = script.read_bytes()
    env = _env(state, "600")
    client = [sys.executable, str(script)]
    assert subprocess.run([*client, "run", "--", "true"], env=env, cwd=workspace,
                          timeout=60).returncode == 0
    server = _wait_for_server(state)
    assert server in _runs_under(env, workspace, f"6{time.monotonic_ns() % 10**9}",
                                 program=client)  # (served)
    done = subprocess.run([*client, "run", "--preset", "workspace-write", "--", "sh", "-c",
                           "echo pwned >> bin/stockade"], env=env, cwd=workspace,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and script.read_bytes() == before, done.stderr


def test_a_client_of_another_interpreter_or_venv_is_not_served(state, workspace, tmp_path):
    """Attack A14: a server of one installation serves no client of another (a project's own
    venv): its run would judge the server's host code, and the client's venv in the
    workspace would be writable."""
    env = _env(state, "600")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    venv = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    other = [str(venv / "bin" / "python"), PROGRAM]
    assert server not in _runs_under(env, workspace, f"7{time.monotonic_ns() % 10**9}",
                                     program=other)
    assert server in _runs_under(env, workspace, f"8{time.monotonic_ns() % 10**9}")


def test_a_client_with_another_nice_value_is_not_served(state, workspace):
    """Attack A16: a served run takes the server's nice value, CPU affinity, scheduling
    policy and OOM score adjustment, so they must be the client's."""
    env = _env(state, "600")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    assert server not in _runs_under(env, workspace, f"9{time.monotonic_ns() % 10**9}",
                                     prefix=["nice", "-n", "5"])


def test_one_server_at_a_time_whatever_starts_together(state):
    """Attack A5: servers started together take the socket from one another, and all but the
    last would wait unreachable for their idle time: the lock lets one start."""
    env = {**_env(state, "600"), "STOCKADE_STATE_DIR": str(state)}
    started = [subprocess.Popen([sys.executable, "-P", "-m", "stockade.cli.autoserver"],
                                env=env, cwd="/", start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(3)]
    server = _wait_for_server(state)
    deadline = time.monotonic() + 30
    while sum(p.poll() is None for p in started) > 1:
        assert time.monotonic() < deadline, "more than one server kept running"
        time.sleep(0.1)
    assert [p.pid for p in started if p.poll() is None] == [server]
    assert all(p.returncode == 0 for p in started if p.poll() is not None)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed here")
def test_a_traced_run_starts_no_server(state, workspace):
    """Attack A17: under `strace -f` the server would be traced too, and the trace would
    wait for it (and show the environments of the runs it serves)."""
    done = subprocess.run(["strace", "-f", "-o", os.devnull, sys.executable, PROGRAM, "run",
                           "--", "true"], env=_env(state, "600"), cwd=workspace, timeout=60)
    assert done.returncode == 0
    time.sleep(2)
    assert _server_pid(state) is None


def test_the_idle_time_is_bounded():
    """Attack A3: an idle time past what a wait can take made every spare fail at once."""
    assert idle_seconds({IDLE_ENV: "1e10"}) == idle_seconds({IDLE_ENV: "inf"}) == IDLE_MOST
    assert idle_seconds({IDLE_ENV: "nan"}) is None and idle_seconds({IDLE_ENV: "-1"}) is None
    assert idle_seconds({IDLE_ENV: "soon"}) is None and idle_seconds({}) == 600


@pytest.mark.parametrize("differs", ["pycache-prefix", "user-base", "module-of-its-own"])
def test_a_client_that_imports_otherwise_is_not_served(state, workspace, tmp_path, differs):
    """Attack B1, B2, B5: a client whose bytecode cache prefix (`-X pycache_prefix`) or user
    site differs from the server's, or that imported a module the server has not (a wrapper
    that loads a file of the workspace): the server's child would judge the host code of
    neither, so it runs the command line itself."""
    env = _env(state, "600")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    program = [sys.executable, PROGRAM]
    if differs == "pycache-prefix":
        program = [sys.executable, "-X", f"pycache_prefix={workspace / 'pyc'}", PROGRAM]
    elif differs == "user-base":
        env = {**env, "PYTHONUSERBASE": str(workspace / "userbase")}
    else:
        (workspace / "toolrc.py").write_text("X = 1\n")
        wrapper = tmp_path / "wrapper.py"
        wrapper.write_text(
            "import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('toolrc', {str(workspace)!r} "
            "+ '/toolrc.py')\n"
            "sys.modules['toolrc'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(sys.modules['toolrc'])\n"
            "from stockade.program import main\n"
            "sys.exit(main())\n")
        program = [sys.executable, str(wrapper)]
    assert server not in _runs_under(env, workspace, f"5{time.monotonic_ns() % 10**9}",
                                     program=program)


def test_a_client_that_imported_no_importlib_is_served(state, workspace):
    """A thin client that never imports `importlib` (here with -S; a non-editable install's
    `stockade` script under a Python whose site imports none) holds `_frozen_importlib` with
    no file, its origin "frozen"; the server (started with -m) named that module by its file,
    so the client, judged to have imported a module the server has not, was never served.
    A module with no file is no fact."""
    env = _env(state, "600")
    program = [sys.executable, "-S", PROGRAM]
    assert subprocess.run([*program, "run", "--", "true"], env=env, cwd=workspace,
                          timeout=60).returncode == 0
    server = _wait_for_server(state)
    assert server in _runs_under(env, workspace, f"4{time.monotonic_ns() % 10**9}",
                                 program=program)


def test_a_served_run_starts_where_its_client_started():
    """Attack B11: the client's starting directory (stockade._started_in, where it first
    imported Stockade) is the served run's, not the directory its request names."""
    import stockade
    from stockade.cli import server
    from stockade.cliwire import FACTS, program_facts

    words = [FACTS, *program_facts(), "run", "--", "true"]
    words[7] = "/where/it/started"  # (program_parts' seventh fact, after FACTS)
    program, argv = server._program(words)
    assert argv == ["run", "--", "true"]
    saved = (sys.orig_argv, sys.argv, list(sys.path), stockade._started_in)
    try:
        program.become()
        assert stockade._started_in == "/where/it/started"
    finally:
        sys.orig_argv, sys.argv, sys.path[:], stockade._started_in = saved


def test_a_request_the_server_cannot_read_runs_here(state, workspace):
    """Attack B9: a request the server cannot decode (a variable with an empty name) is
    answered "run it yourself", never with a lost server."""
    from stockade.cliwire import NOT_SERVED, encode_request, program_facts

    assert _run("true", env=_env(state, "600"), cwd=workspace).returncode == 0
    _wait_for_server(state)
    body = encode_request(["run", "--", "true"], str(workspace), 0o22, {b"": b"x"},
                          program_facts())
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(state / SOCKET_NAME))
        conn.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                               struct.pack("3i", 0, 1, 2))])
        conn.settimeout(30)
        assert conn.recv(64) == NOT_SERVED


def test_a_server_whose_code_changed_on_disk_ends(state, workspace):
    """Attack B12: after an upgrade or a checkout, the server would run its old code for a
    client of the new one; it turns the client away (it runs the command line itself) and
    ends. (The change here is a module file's change time: chmod to its own mode.)"""
    import stockade.cliwire

    env = _env(state, "600")
    assert _run("true", env=env, cwd=workspace).returncode == 0
    server = _wait_for_server(state)
    pidfd = os.pidfd_open(server)
    try:
        module = stockade.cliwire.__file__
        os.chmod(module, os.stat(module).st_mode & 0o7777)
        assert server not in _runs_under(env, workspace, f"6{time.monotonic_ns() % 10**9}")
        assert select.select([pidfd], [], [], 30)[0], "the server did not end"
    finally:
        os.close(pidfd)
