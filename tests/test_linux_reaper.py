"""The small pid 1 (stockade/linux/reaper.c): a command that outlives reaper.GRACE is kept by
a static program instead of a Python process. Real sandboxes: it reaps, reports, holds the
process limit, dies with its owner, and the command can neither signal nor trace it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import (
    PYTHON,
    api_owner,
    check_the_process_limit_is_exact,
    kill_owner_once_running,
    marked,
    policy_for,
    py,
    sandbox,
    unavailable,
)

import stockade
from stockade.linux import reaper

pytestmark = pytest.mark.usefixtures("linux")

AFTER_GRACE = reaper.GRACE * 4  # seconds a command waits to be sure it is under the reaper


@pytest.fixture(autouse=True)
def built():
    if not reaper.built():
        unavailable(f"the reaper was not built ({reaper.PROGRAM}): setup.py needs a C compiler "
                    "and a static C library")


def _init_of(marker: str) -> int:
    """Host pid of the pid 1 of the sandbox whose command line has `marker`."""
    deadline = time.monotonic() + 10
    while not (pids := marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pids, "the sandbox never started"
    with open(f"/proc/{pids[0]}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def test_an_idle_sandbox_is_kept_by_the_small_pid1(ws):
    workspace, _ = ws
    marker = f"986.{os.getpid()}1"
    cancel = threading.Event()
    results = []
    runner = threading.Thread(target=lambda: results.append(stockade.run(
        ["sleep", marker], policy_for(), workspace=workspace, cancel=cancel)))
    runner.start()
    try:
        init = _init_of(marker)
        time.sleep(AFTER_GRACE)
        assert os.readlink(f"/proc/{init}/exe").startswith("/memfd:stockade-reaper")
        with open(f"/proc/{init}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        assert int(status["VmRSS"].split()[0]) < 2048, status["VmRSS"]  # KiB
        assert status["Threads"].strip() == "1"
        holders = [pid for pid in _children(init) if pid not in marked(marker)]
        assert len(holders) == 1  # `reaper hold`, keeping the starter thread's process slot
    finally:
        cancel.set()
        runner.join(30)
    assert results and results[0].cancelled
    assert not marked(marker)
    assert not os.path.exists(f"/proc/{init}")


def test_the_exit_status_signal_and_output_after_the_grace(ws):
    workspace, _ = ws
    r = sandbox(["sh", "-c", f"sleep {AFTER_GRACE}; echo late; echo err >&2; exit 7"],
                workspace)
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (7, None, b"late\n", b"err\n")
    r = sandbox(["sh", "-c", f"sleep {AFTER_GRACE}; kill -KILL $$"], workspace)
    assert (r.exit_code, r.signal) == (None, 9)
    assert "run" in r.timings


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
time.sleep(%s)
orphans(5)
print('late:', zombies_within(2))
"""


def test_orphans_are_reaped_while_the_command_runs(ws):
    """Orphans that exit do not stay zombies until the command ends, before the grace and
    after it: a zombie would count against the sandbox's process limit."""
    workspace, _ = ws
    r = py(ZOMBIES % AFTER_GRACE, workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == b"early: 0\nlate: 0\n"


def test_the_small_pid1_cannot_be_signalled_or_traced(ws):
    workspace, _ = ws
    r = py(textwrap.dedent(f"""
        import ctypes, errno, os, signal, time
        time.sleep({AFTER_GRACE})
        libc = ctypes.CDLL(None, use_errno=True)
        with open('/proc/1/task/1/children') as f:
            others = [int(p) for p in f.read().split() if int(p) != os.getpid()]
        def attempt(action):
            try:
                action()
                return 'ok'
            except OSError as exc:
                return errno.errorcode[exc.errno]
        def attach(pid):
            if libc.ptrace(16, pid, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), 'ptrace')
        print('exe:', os.readlink('/proc/1/exe') if attempt(lambda: os.readlink('/proc/1/exe'))
              == 'ok' else 'hidden')
        for name, pid in [('init', 1)] + [('holder', p) for p in others]:
            print(name, 'kill:', attempt(lambda: os.kill(pid, signal.SIGKILL)))
            print(name, 'ptrace:', attempt(lambda: attach(pid)))
            print(name, 'mem:', attempt(lambda: open(f'/proc/{{pid}}/mem', 'rb').close()))
    """), workspace)
    assert r.exit_code == 0, r.stderr
    lines = dict(line.split(": ", 1) for line in r.stdout.decode().splitlines())
    assert lines.pop("exe") == "hidden"
    assert set(lines) == {f"{who} {what}" for who in ("init", "holder")
                          for what in ("kill", "ptrace", "mem")}
    assert all(outcome in ("EPERM", "EACCES") for outcome in lines.values()), lines


def test_the_process_limit_stays_exact_after_the_grace_rootless(ws):
    """The exec ends pid 1's starter thread; the holder keeps its slot, so the command still
    holds exactly `pids` processes at once."""
    workspace, _ = ws
    check_the_process_limit_is_exact(workspace, after=AFTER_GRACE)


def test_the_sandbox_dies_with_its_owner_after_the_grace(ws):
    workspace, _ = ws
    marker = f"986.{os.getpid()}2"
    kill_owner_once_running(api_owner(workspace, marker), marker, after=AFTER_GRACE)


def test_without_the_reaper_pid1_stays_python_and_still_reaps(ws):
    """Where the reaper was not built, pid 1 stays the Python process for the whole run: it
    reaps orphans as they exit, and reports the command's exit, past the grace too."""
    workspace, _ = ws
    owner = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from conftest import PYTHON, policy_for
        import stockade
        from stockade.linux import reaper, zygote
        reaper.descriptor = lambda: None  # as if not built
        zygote.fork_directly()  # (the owner starts its sandboxes itself, with that)
        code = {ZOMBIES % AFTER_GRACE!r} + "print(open('/proc/1/comm').read().strip())"
        r = stockade.run([PYTHON, '-c', code], policy_for(), workspace={str(workspace)!r})
        sys.stdout.write(r.stdout.decode() + r.stderr.decode() + str(r.exit_code))
    """)], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
        text=True, timeout=60)
    assert owner.stdout == "early: 0\nlate: 0\npython\n0", owner.stderr


def test_a_command_at_its_process_limit_keeps_the_python_pid1_rootless(ws):
    """A command that holds every process it may when the grace ends leaves no slot for the
    holder: pid 1 then stays the Python process, and the limit stays exact."""
    workspace, _ = ws
    code = textwrap.dedent(f"""
        import os, time
        time.sleep({AFTER_GRACE})
        try:
            if os.fork() == 0:
                os._exit(0)
            os.wait()
            state = 'more'
        except OSError:
            state = 'full'
        print(state, open('/proc/1/comm').read().strip())
    """)
    # the shell fills the limit of 2 at once (itself and a sleep) and becomes the Python code
    r = sandbox(["sh", "-c", f'sleep 5 & exec {PYTHON} -c "$0"', code], workspace, pids=2,
                timeout=30)
    assert r.exit_code == 0, r.stderr
    if os.getuid() != 0:  # (RLIMIT_NPROC does not bind host root: see limits.py)
        assert r.stdout == b"full python\n"
