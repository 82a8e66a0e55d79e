"""`keep_detached` (docs/sessions.md): a warm sandbox opened with it keeps what a command
detached — a process in a session of its own — when the command exits by itself, until the
sandbox closes; what stayed in the command's session dies with it, as without the option, and
so does everything a timed-out command started. Real sandboxes, checked from the host: the
kept process is still confined (the sandbox's pid namespace, no_new_privs, seccomp, its
limits), a command's result does not wait for the pipes it holds, nothing of it outlives
`close()`, and a command cannot turn the option on."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import replace

import pytest
from conftest import PYTHON, gone, marked, policy_for

import stockade

pytestmark = pytest.mark.usefixtures("linux")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0  # (collected on Windows too)
MEMORY = 1 << 30

# A process that leaves what argv[2] says (its process group, or its session), says so with
# the file argv[1], then sleeps; its command line carries argv[3] (a marker).
HOLD = textwrap.dedent("""
    import os, sys, time
    if sys.argv[2] == "group":
        os.setpgid(0, 0)
    elif sys.argv[2] == "session":
        os.setsid()
    open(sys.argv[1], "w").close()
    time.sleep(1000)
""")


def holding(workspace, marker: str, tail: str = "") -> list[str]:
    """A command that starts three holders (left their session, their process group only,
    neither: MARKER-session, MARKER-group, MARKER-plain), each with the command's stdout and
    stderr, says "up" once all three are where they go, runs `tail`, and exits."""
    (workspace / "hold.py").write_text(HOLD)
    return ["sh", "-c", f"for kind in session group plain; do "
                        f"{PYTHON} hold.py ready-$kind $kind {marker}-$kind & done; "
                        "while [ ! -f ready-session ] || [ ! -f ready-group ] || "
                        "[ ! -f ready-plain ]; do sleep 0.05; done; rm ready-*; echo up" + tail]


def confined(pid: int, sandbox: stockade.Sandbox) -> None:
    """`pid` (a host pid) is still inside the sandbox: its pid namespace (whose pid_max is
    limits.pids) where it has one, no_new_privs, seccomp, and limits.memory as RLIMIT_AS."""
    if sandbox._policy.isolation != "landlock":
        assert os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{sandbox.pid}/ns/pid")
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":\t", 1) for line in f.read().splitlines())
    assert (status["NoNewPrivs"].strip(), status["Seccomp"].strip()) == ("1", "2"), status
    with open(f"/proc/{pid}/limits") as f:
        address = next(line for line in f if line.startswith("Max address space"))
    assert address.split()[3:5] == [str(MEMORY), str(MEMORY)], address


def within(seconds: float, sandbox: stockade.Sandbox, argv: list[str]) -> stockade.Result:
    """`sandbox.run(argv)`'s Result, which must come within `seconds` (else the sandbox is
    closed, which ends the run, and the test fails)."""
    done: list[stockade.Result] = []
    thread = threading.Thread(target=lambda: done.append(sandbox.run(argv)), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        sandbox.close()
        thread.join(5)
        pytest.fail(f"no result within {seconds} s")
    return done[0]


def check_kept_until_close(sandbox: stockade.Sandbox, workspace) -> None:
    marker = f"stockade-{uuid.uuid4().hex}"
    try:
        # the detached holder keeps the command's stdout open: the result does not wait for it
        r = within(10, sandbox, holding(workspace, marker))
        assert (r.exit_code, r.stdout) == (0, b"up\n"), r
        # what stayed in the command's session (its group, or only out of its group) is dead
        assert marked(f"{marker}-group") == marked(f"{marker}-plain") == []
        [pid] = marked(f"{marker}-session")
        kept = os.pidfd_open(pid)
        confined(pid, sandbox)
        assert sandbox.run(["echo", "next"]).stdout == b"next\n"
        assert marked(f"{marker}-session") == [pid]  # alive through the next command
    finally:
        sandbox.close()
    assert select.select([kept], [], [], 5)[0], "the detached process outlived close()"
    os.close(kept)
    assert gone(marker, within=2)


def test_what_a_command_detached_runs_on_until_the_sandbox_closes(ws):
    workspace, _ = ws
    check_kept_until_close(stockade.Sandbox(policy_for("workspace-write", memory=MEMORY),
                                            workspace=workspace, keep_detached=True),
                           workspace)


def test_in_the_landlock_tier_too(ws):
    """The tier without namespaces: the keeper, the agent's own subreaper, ends the kept
    process with the sandbox."""
    workspace, _ = ws
    policy = replace(policy_for("workspace-write", memory=MEMORY), isolation="landlock")
    if ROOT:  # (RLIMIT_NPROC does not bind root: the tier refuses a policy's own limits.pids)
        policy = replace(policy, limits=replace(policy.limits, pids=None))
    check_kept_until_close(stockade.Sandbox(policy, workspace=workspace, keep_detached=True),
                           workspace)


def test_a_timed_out_command_takes_what_it_detached_with_it(ws):
    """A stop (timeout) kills everything the command started, detached or not; what an
    earlier command detached lives on."""
    workspace, _ = ws
    earlier, stopped = (f"stockade-{uuid.uuid4().hex}" for _ in range(2))
    with stockade.Sandbox(policy_for("workspace-write"), workspace=workspace,
                          keep_detached=True) as sandbox:
        assert sandbox.run(holding(workspace, earlier)).stdout == b"up\n"
        r = sandbox.run(holding(workspace, stopped, "; sleep 30"), timeout=2)
        assert r.timed_out and r.stdout == b"up\n", r
        assert marked(stopped) == []
        assert len(marked(f"{earlier}-session")) == 1
    assert gone(earlier, within=5)


# The agent's SIGCHLD disposition after a keep_detached hello: whether SA_RESTART is set
# (glibc's struct sigaction: the handler, a 128-byte mask, then the int flags; SA_RESTART is
# 0x10000000).
RESTARTS = textwrap.dedent("""
    import ctypes, os, signal
    from stockade.session.agent import Agent
    Agent(bytes(32), *os.pipe())._keep_detached()
    action = ctypes.create_string_buffer(256)
    assert ctypes.CDLL(None).sigaction(signal.SIGCHLD, None, action) == 0
    print(int.from_bytes(action.raw[136:140], "little") & 0x10000000 != 0)
""")


def test_a_child_exiting_fails_no_call_of_the_agent():
    """The SIGCHLD that wakes the agent (to reap a kept process) restarts the call it
    interrupts: without SA_RESTART, C code that does not retry EINTR fails — a mmap that
    pid 1's memory watch holds (seccomp user notification) in malloc or dlopen — and the
    agent died (one timed-out test run in six: dlopen in os.wait4's first import)."""
    done = subprocess.run([sys.executable, "-c", RESTARTS], capture_output=True, text=True)
    assert done.stdout == "True\n", done


def test_without_it_a_command_cannot_keep_what_it_detached(ws):
    """A default sandbox: a command cannot reach the agent's channel to ask for the option
    (the agent is not dumpable: its descriptors cannot be opened), and what it detached dies
    with it."""
    workspace, _ = ws
    marker = f"stockade-{uuid.uuid4().hex}"
    grab = ("import os\nfor n in (0, 1):\n    try:\n"
            "        open(f'/proc/{os.getppid()}/fd/{n}', 'wb').close(); print('opened')\n"
            "    except OSError as exc:\n        print(exc.errno)\n")
    with stockade.Sandbox(policy_for("workspace-write"), workspace=workspace) as sandbox:
        r = sandbox.run([PYTHON, "-c", grab])
        assert r.stdout.split() == [b"13", b"13"], r  # EACCES, both
        assert sandbox.run(holding(workspace, marker)).stdout == b"up\n"
        assert marked(marker) == []


def test_a_kept_process_that_exits_between_commands_is_reaped(ws):
    """No command runs when it exits: the agent reaps it all the same (a zombie would hold a
    pid of limits.pids until the next command's end)."""
    workspace, _ = ws
    marker = f"stockade-{uuid.uuid4().hex}"
    brief = "import sys, time; open('ready', 'w').close(); time.sleep(1)"
    with stockade.Sandbox(policy_for("workspace-write"), workspace=workspace,
                          keep_detached=True) as sandbox:
        r = sandbox.run(["sh", "-c", f'setsid {PYTHON} -c "{brief}" {marker} & '
                                     "while [ ! -f ready ]; do sleep 0.05; done; echo up"])
        assert r.stdout == b"up\n", r
        [pid] = marked(marker)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}"):  # (a zombie keeps it, in state Z)
            assert time.monotonic() < deadline, "the kept process was never reaped"
            time.sleep(0.05)
