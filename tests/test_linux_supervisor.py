"""The sandbox's pid 1 once its view is built: supervisor.c, a static program. Real sandboxes:
it is small, it starts the command as asked and types what keeps it from starting, it reaps,
it refuses a launch for another view than its spare was made for, and the command can neither
stop, trace nor read it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import marked, policy_for, py, sandbox, unavailable

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.linux import fdpass, frame, launcher, seccomp, supervisor

pytestmark = pytest.mark.usefixtures("linux")


@pytest.fixture(autouse=True)
def built():
    if not supervisor.built():
        unavailable(supervisor.MISSING)


def _init_of(marker: str) -> int:
    """Host pid of the pid 1 of the sandbox whose command line has `marker`."""
    deadline = time.monotonic() + 10
    while not (pids := marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids, "the sandbox never started"
    with open(f"/proc/{pids[0]}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_running_sandbox_is_kept_by_the_small_pid1(ws):
    workspace, _ = ws
    marker = f"986.{os.getpid()}1"
    cancel = threading.Event()
    results = []
    runner = threading.Thread(target=lambda: results.append(stockade.run(
        ["sleep", marker], policy_for(), workspace=workspace, cancel=cancel)))
    runner.start()
    try:
        init = _init_of(marker)
        assert os.readlink(f"/proc/{init}/exe").startswith("/memfd:stockade-supervisor")
        with open(f"/proc/{init}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        assert int(status["VmRSS"].split()[0]) < 2048, status["VmRSS"]  # KiB
        assert status["Threads"].strip() == "1"
        with open(f"/proc/{init}/task/{init}/children") as f:
            assert [int(pid) for pid in f.read().split()] == marked(marker)  # nothing else
    finally:
        cancel.set()
        runner.join(30)
    assert results and results[0].cancelled
    assert not marked(marker)
    assert not os.path.exists(f"/proc/{init}")


def test_the_exit_status_signal_output_and_stages(ws):
    workspace, _ = ws
    r = sandbox(["sh", "-c", "echo out; echo err >&2; exit 7"], workspace)
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (7, None, b"out\n", b"err\n")
    assert list(r.timings)[-3:] == ["exec", "run", "settle"]
    r = sandbox(["sh", "-c", "sleep 0.2; kill -KILL $$"], workspace)
    assert (r.exit_code, r.signal) == (None, 9)


def test_the_command_gets_its_directory_umask_environment_session_and_signals(ws):
    workspace, _ = ws
    sub = workspace / "sub dir"
    sub.mkdir()
    old = os.umask(0o027)
    try:
        r = py(textwrap.dedent("""
            import os
            print(os.getcwd())
            print(oct(os.umask(0)))
            print(os.getsid(0) == os.getpid())
            print(sorted(os.listdir('/proc/self/fd')))
        """), sub)
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.stderr
    cwd, umask, leader, fds = r.stdout.decode().splitlines()
    assert (cwd, umask, leader) == (str(sub), "0o27", "True")
    assert fds == "['0', '1', '2', '3']"  # stdio, and the listing's own descriptor
    # (Python sets handlers of its own: a plain program shows what the command was given)
    r = sandbox(["cat", "/proc/self/status"], workspace)
    status = dict(line.split(":\t", 1) for line in r.stdout.decode().splitlines())
    assert {status[mask] for mask in ("SigBlk", "SigIgn", "SigCgt")} == {"0" * 16}


def test_start_failures_are_typed_and_name_the_command_byte_for_byte(ws):
    """A name that is not UTF-8 comes back exactly, in the escaped form every text Stockade
    prints has (issue 29 T2: `\\xff` for the byte, `\\x0a` for the newline, which raw would
    forge a line); a file the kernel cannot execute is not run through /bin/sh instead
    (execvp would)."""
    from stockade.visibletext import visible

    workspace, _ = ws
    name = "no-such-\udcff-é\n\"x\""
    with pytest.raises(stockade.StartError) as caught:
        sandbox([name], workspace)
    assert caught.value.code == "command_not_found"
    assert caught.value.message.startswith(
        "no-such-\\xff-é\\x0a\"x\": not found in the sandbox's PATH ("), caught.value.message
    assert caught.value.message.startswith(visible(name))
    script = workspace / "script"
    script.write_text("echo RAN > ran\n")
    script.chmod(0o755)
    with pytest.raises(stockade.StartError) as caught:
        sandbox(["./script"], workspace, exec_from_write=True)
    assert caught.value.code == "command_not_executable"
    assert "Exec format error" in caught.value.message
    assert not (workspace / "ran").exists()


ZOMBIES = """
import os, time
def orphans(count):
    for _ in range(count):
        if os.fork() == 0:
            if os.fork() == 0:
                os._exit(0)  # an orphan: re-parented to pid 1, then exits at once
            os._exit(0)
        os.wait()
def zombies_within(seconds):
    deadline = time.monotonic() + seconds
    while True:
        found = 0
        for pid in os.listdir('/proc'):
            try:
                with open(f'/proc/{pid}/stat') as f:
                    found += f.read().rsplit(')', 1)[1].split()[0] == 'Z'
            except (OSError, IndexError):
                pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)
orphans(5)
print('early:', zombies_within(2))
time.sleep(0.3)
orphans(5)
print('late:', zombies_within(2))
"""


def test_orphans_are_reaped_while_the_command_runs(ws):
    """Orphans that exit do not stay zombies until the command ends: a zombie would count
    against the sandbox's process limit."""
    workspace, _ = ws
    r = py(ZOMBIES, workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == b"early: 0\nlate: 0\n"


def test_the_small_pid1_cannot_be_signalled_traced_or_read(ws):
    workspace, _ = ws
    r = py(textwrap.dedent("""
        import ctypes, errno, os
        libc = ctypes.CDLL(None, use_errno=True)
        def attempt(action):
            try:
                action()
                return 'ok'
            except OSError as exc:
                return errno.errorcode[exc.errno]
        def attach():
            if libc.ptrace(16, 1, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), 'ptrace')
        print('exe:', attempt(lambda: os.readlink('/proc/1/exe')))
        print('ptrace:', attempt(attach))
        print('mem:', attempt(lambda: open('/proc/1/mem', 'rb').close()))
        print('environ:', attempt(lambda: open('/proc/1/environ', 'rb').read()))
        print('kill:', attempt(lambda: os.kill(1, 9)))
    """), workspace)
    assert r.exit_code == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.decode().splitlines())
    assert set(lines) == {"exe", "ptrace", "mem", "environ", "kill"}
    assert all(outcome in ("EPERM", "EACCES") for outcome in lines.values()), lines


def test_a_spare_refuses_a_launch_for_another_view(ws):
    """A spare made for one view (here: no write root) checks the launch's view digest: a
    launch for another view (the workspace writable) is refused before anything runs."""
    workspace, _ = ws
    bpf = seccomp.compile_filter()
    context = CompileContext.current(workspace)
    made_for = frame.view_frame(compile_policy(policy_for("read-only"), ["true"], context),
                                   bpf, frozenset())
    request = compile_policy(policy_for(), ["sh", "-c", "echo pwned > file"], context)
    skeleton = launcher.start()
    with skeleton.handoff:
        skeleton.handoff.send(b"V" + made_for)
        assert skeleton.handoff.recv(100).startswith(b"M")  # mounted, confined: a supervisor
        request_r, request_w = os.pipe()
        status_r, status_w = os.pipe()
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launch = frame.encode_launch(request, 0o022, frame.view_frame(request, bpf,
                                                                            frozenset()))
        os.write(request_w, frame.encode_frame(request.encode(), bpf, frozenset(), launch))
        null = os.open(os.devnull, os.O_RDWR)
        fdpass.send_fds(skeleton.handoff, b"G", [null, null, null, request_r, status_w,
                                                 theirs.fileno()])
        for fd in (null, request_r, status_w):
            os.close(fd)
        theirs.close()
        with os.fdopen(status_r, "rb") as status:
            events = status.read().decode()
    os.close(request_w)
    control.close()
    os.waitid(os.P_PIDFD, skeleton.pidfd, os.WEXITED)
    os.close(skeleton.pidfd)
    assert '"event": "started"' not in events
    assert '"code": "setup_failed"' in events and "made for another view" in events, events
    assert not (workspace / "file").exists()


def test_without_the_supervisor_the_backend_refuses_typed(ws, tmp_path):
    workspace, _ = ws
    owner = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from conftest import policy_for
        import stockade
        from stockade.linux import supervisor
        supervisor.PROGRAM = {str(tmp_path / "missing")!r}  # as if not built
        try:
            stockade.run(['true'], policy_for(), workspace={str(workspace)!r})
        except stockade.StockadeError as exc:
            print(type(exc).__name__, exc.code)
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                "STOCKADE_STATE_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=60)
    assert owner.stdout.split()[-1] == "supervisor_not_built", owner.stdout + owner.stderr


def test_the_command_cannot_limit_or_renice_pid_1(ws):
    """pid 1 answers the command's watched calls: the command setting its RLIMIT_NOFILE to 0
    (it made the launch fail), its priority or its I/O priority is refused, and the run ends
    as the command says."""
    workspace, _ = ws
    code = textwrap.dedent("""
        import ctypes, errno, os, resource
        libc = ctypes.CDLL(None, use_errno=True)
        said = []
        try:
            resource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0))
            said.append("prlimit worked")
        except OSError as exc:
            said.append(errno.errorcode[exc.errno])
        try:
            os.setpriority(os.PRIO_PROCESS, 1, 19)
            said.append("setpriority worked")
        except OSError as exc:
            said.append(errno.errorcode[exc.errno])
        done = libc.syscall(251, 1, 1, (3 << 13) | 7)  # ioprio_set(WHO_PROCESS, 1, IDLE)
        said.append("ioprio worked" if done == 0 else errno.errorcode[ctypes.get_errno()])
        open("made", "w").close()
        print(" ".join(said))
    """)
    r = py(code, workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == [b"EPERM", b"EPERM", b"EPERM"], r.stdout
    assert (workspace / "made").exists()
