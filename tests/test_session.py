"""Warm sandboxes end to end, with real sandboxes: many commands per session, live streaming,
stdin, timeouts, cancellation, output bounds, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest
from conftest import PYTHON, gone, marked, policy_for

import stockade
from stockade.errors import StartError
from stockade.session.errors import SessionError
from stockade.session.exchange import Output
from stockade.session.protocol import MAX_FRAME

pytestmark = pytest.mark.usefixtures("linux")


@pytest.fixture
def sb(ws):
    workspace, _ = ws
    with stockade.Sandbox(policy_for("workspace-write"), workspace=workspace) as sandbox:
        yield sandbox


def sleeper(marker: str) -> str:
    """A shell word list for a process that sleeps with `marker` in its command line."""
    return f"{PYTHON} -c 'import time; time.sleep(1000)' {marker}"


def spawn_tree(marker: str) -> list[str]:
    """A command that starts sleepers carrying `marker` — one in its process group, one that
    left it (setsid), one a grandchild — says "up" once they run, then waits."""
    return ["sh", "-c", f"{sleeper(marker)} & setsid {sleeper(marker)} & "
                        f"sh -c \"{sleeper(marker)} & wait\" & sleep 0.3; echo up; wait"]


def test_twenty_commands_in_one_session_each_with_its_own_argv_cwd_env(sb, ws):
    workspace, _ = ws
    pids = set()
    for i in range(20):
        (workspace / f"d{i}").mkdir()
        r = sb.run(["sh", "-c", 'echo "$0 $(pwd) $N $$"', f"arg{i}"], cwd=workspace / f"d{i}",
                   env={"N": str(i)})
        arg, cwd, n, pid = r.stdout.decode().split()
        assert (arg, cwd, n) == (f"arg{i}", str(workspace / f"d{i}"), str(i)), r
        assert r.exit_code == 0 and r.backend == "linux-session"
        pids.add(pid)
    assert len(pids) == 20  # each a fresh process, in one sandbox that never restarted


def test_an_empty_argument_reaches_the_command(sb):
    r = sb.run(["sh", "-c", 'printf "[%s]" "$@"', "sh", "-N", "", "-f"])
    assert (r.exit_code, r.stdout) == (0, b"[-N][][-f]"), r


def test_a_command_of_a_megabyte_of_arguments_runs(sb):
    """An argv of 1 MiB (16 arguments of 64 KiB: within the kernel's ARG_MAX) travels in its
    one `exec` frame; one past the frame's bound is a usage error, and the session goes on."""
    chunk = "x" * (64 << 10)
    r = sb.run(["printf", "%s", *[chunk] * 16])
    assert (r.exit_code, len(r.stdout)) == (0, 16 << 16), r.stderr
    with pytest.raises(stockade.UsageError, match="take more than"):
        sb.run(["true", *[chunk] * (MAX_FRAME // len(chunk) + 1)])
    assert sb.run(["true"]).exit_code == 0


def test_a_command_runs_in_a_directory_of_the_sandboxs_own_tmp(sb, ws):
    """/tmp and /dev/shm are the sandbox's own: a directory a command made there is a working
    directory for the next, which the host cannot see (a missing one is `cwd_invalid`); a
    directory on the host under /tmp that no root holds is not in the sandbox's view."""
    workspace, _ = ws
    assert sb.run(["mkdir", "-p", "/tmp/made/in", "/dev/shm/made"]).exit_code == 0
    assert not os.path.exists("/tmp/made/in")
    for made in ("/tmp/made/in", "/tmp/made/../made/in", "/dev/shm/made"):
        r = sb.run(["pwd"], cwd=made)
        assert r.stdout == os.path.normpath(made).encode() + b"\n", r
    with tempfile.TemporaryDirectory(dir="/tmp") as hosts:
        with pytest.raises(StartError) as caught:
            sb.run(["pwd"], cwd=hosts)
    assert caught.value.code == "cwd_invalid"
    # a root under /tmp is the host's directory: the host checks it
    assert sb.run(["pwd"], cwd=workspace).stdout == f"{workspace}\n".encode()
    with pytest.raises(stockade.PolicyError, match="does not exist"):
        sb.run(["pwd"], cwd=workspace / "missing")


def test_two_hundred_commands_in_one_session(sb):
    for i in range(200):
        r = sb.run(["echo", str(i)], input=b"x" if i % 2 else None)
        assert (r.exit_code, r.stdout) == (0, f"{i}\n".encode())


def test_each_command_has_its_own_digest_and_request_id(sb):
    a, b, c = sb.run(["true"]), sb.run(["true"]), sb.run(["echo", "x"])
    assert a.digest == b.digest != c.digest
    assert a.request_id != b.request_id


def test_stdin_round_trips_beyond_the_window(sb):
    data = os.urandom(3 << 20)
    r = sb.run(["cat"], input=data)
    assert r.stdout == data and r.exit_code == 0
    assert sb.run(["cat"]).stdout == b""  # no input: stdin is at its end at once


def test_output_streams_live(sb):
    code = "import time; print('first', flush=True); time.sleep(2); print('second', flush=True)"
    began = time.monotonic()
    arrivals = []
    for event in sb.stream([PYTHON, "-c", code]):
        arrivals.append((time.monotonic() - began, event))
    (t_first, first), *_, (t_end, result) = arrivals
    assert isinstance(first, Output) and first.data == b"first\n" and first.stream == "stdout"
    assert isinstance(result, stockade.Result) and result.stdout == b"first\nsecond\n"
    assert t_end - t_first > 1.5, arrivals  # the first chunk came long before the end


def test_stderr_is_streamed_separately(sb):
    events = list(sb.stream(["sh", "-c", "echo out; echo err >&2"]))
    streams = {e.stream: e.data for e in events if isinstance(e, Output)}
    assert streams == {"stdout": b"out\n", "stderr": b"err\n"}


def count_later(marker: str, delay: float, then: threading.Event | None = None) -> list[int]:
    """After `delay` seconds, record how many marked processes run (then set `then`)."""
    seen: list[int] = []

    def look() -> None:
        seen.append(len(marked(marker)))
        if then is not None:
            then.set()

    threading.Timer(delay, look).start()
    return seen


def test_timeout_kills_the_whole_tree_and_the_session_goes_on(sb):
    marker = f"stockade-{uuid.uuid4().hex}"
    seen = count_later(marker, 1.0)
    r = sb.run(spawn_tree(marker), timeout=1.5)
    assert seen[0] >= 3
    assert r.timed_out and r.signal == signal.SIGKILL
    assert [v.kind for v in r.violations] == ["limits.timeout"]
    assert r.stdout == b"up\n"
    assert gone(marker, within=2)
    assert sb.run(["echo", "still here"]).stdout == b"still here\n"


def test_cancel_kills_the_whole_tree_and_the_session_goes_on(sb):
    marker = f"stockade-{uuid.uuid4().hex}"
    cancel = threading.Event()
    seen = count_later(marker, 1.0, then=cancel)
    r = sb.run(spawn_tree(marker), cancel=cancel)
    assert seen[0] >= 3
    assert r.cancelled and not r.timed_out and r.signal == signal.SIGKILL
    assert gone(marker, within=2)
    assert sb.run(["echo", "ok"]).stdout == b"ok\n"


def test_leaving_a_stream_early_cancels_the_command(sb):
    marker = f"stockade-{uuid.uuid4().hex}"
    for event in sb.stream(spawn_tree(marker)):
        assert event == Output("stdout", b"up\n")
        assert len(marked(marker)) >= 3
        break
    assert gone(marker, within=2)
    assert sb.run(["echo", "ok"]).stdout == b"ok\n"


def test_what_a_command_leaves_behind_is_killed_when_it_exits(sb):
    marker = f"stockade-{uuid.uuid4().hex}"
    events = sb.stream(["sh", "-c", f"setsid {sleeper(marker)} >/dev/null 2>&1 & sleep 0.3; "
                                    "echo started; sleep 0.5"])
    assert next(events) == Output("stdout", b"started\n")
    assert len(marked(marker)) >= 2  # the shell, and the sleeper outside its process group
    assert isinstance(list(events)[-1], stockade.Result)
    assert marked(marker) == []  # killed before the result was reported


def test_a_commands_end_and_late_output_in_one_wakeup_end_it_once(sb):
    """The agent wakes once for a command's exit and for what a process it left wrote after
    it (the agent is stopped meanwhile): ending the command closes its pipes, and their
    events in the same wakeup are not acted on (they ended the agent: session_lost)."""
    with open(f"/proc/{sb.pid}/task/{sb.pid}/children") as f:
        [agent] = map(int, f.read().split())
    events = sb.stream(["sh", "-c", "(sleep 1; echo late; echo late >&2) & echo up; sleep 0.5"])
    assert next(events) == Output("stdout", b"up\n")
    os.kill(agent, signal.SIGSTOP)
    time.sleep(2)  # the command exits, then what it left writes and exits
    os.kill(agent, signal.SIGCONT)
    result = list(events)[-1]
    assert (result.exit_code, result.stdout, result.stderr) == (0, b"up\nlate\n", b"late\n")
    assert sb.run(["echo", "ok"]).stdout == b"ok\n"


def test_output_bound_truncates_the_capture_but_not_the_live_stream(ws):
    workspace, _ = ws
    policy = policy_for("workspace-write", output=1000)
    with stockade.Sandbox(policy, workspace=workspace) as sandbox:
        events = list(sandbox.stream(["head", "-c", "300000", "/dev/zero"]))
    result = events[-1]
    live = b"".join(e.data for e in events[:-1])
    assert len(live) == 300000  # the caller reading live gets every byte
    assert len(result.stdout) == 1000 and result.stdout_truncated
    assert [v.kind for v in result.violations] == ["limits.output"]


def test_a_command_that_cannot_start_is_a_typed_error_and_the_session_goes_on(sb, ws):
    workspace, _ = ws
    with pytest.raises(StartError) as caught:
        sb.run(["no-such-command-anywhere"])
    assert caught.value.code == "command_not_found"
    (workspace / "plain.txt").write_text("not executable")
    with pytest.raises(StartError) as caught:
        sb.run([str(workspace / "plain.txt")])
    assert caught.value.code == "command_not_executable"
    assert sb.run(["true"]).exit_code == 0


def test_exit_status_and_signal_pass_through(sb):
    assert sb.run(["sh", "-c", "exit 7"]).exit_code == 7
    r = sb.run(["sh", "-c", "kill -TERM $$"])
    assert r.exit_code is None and r.signal == signal.SIGTERM
    assert (r.returncode, r.exit_status) == (-signal.SIGTERM, 143)  # as subprocess; the shell


def test_refused_environment_is_refused(sb):
    with pytest.raises(stockade.PolicyError) as caught:
        sb.run(["true"], env={"LD_PRELOAD": "/x.so"})
    assert caught.value.code == "env_refused"


def test_ping(sb):
    assert 0 < sb.ping() < 5


def test_closing_kills_everything_and_a_running_command_sees_it(ws):
    workspace, _ = ws
    marker = f"stockade-{uuid.uuid4().hex}"
    sandbox = stockade.Sandbox(policy_for("workspace-write"), workspace=workspace)
    outcome: list[BaseException] = []

    def running() -> None:
        try:
            sandbox.run(spawn_tree(marker))
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    worker = threading.Thread(target=running)
    worker.start()
    deadline = time.monotonic() + 10
    while len(marked(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked(marker)) >= 3
    sandbox.close()
    worker.join(10)
    assert isinstance(outcome[0], SessionError) and outcome[0].code == "session_closed"
    assert gone(marker)
    with pytest.raises(SessionError):
        sandbox.run(["true"])


def test_sigkilling_the_owner_leaves_nothing_behind(ws):
    workspace, _ = ws
    marker = f"stockade-{uuid.uuid4().hex}"
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[os.path.dirname(os.path.dirname(stockade.__file__)),
                         os.path.dirname(__file__)]!r}
        import stockade
        from conftest import policy_for
        with stockade.Sandbox(policy_for("workspace-write"), workspace={str(workspace)!r}) as sb:
            for event in sb.stream({spawn_tree(marker)!r}):
                print("running", flush=True)
                sys.stdin.read()
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert owner.stdout.readline() == b"running\n"
        assert len(marked(marker)) >= 3
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert gone(marker)


def test_async_sandbox(ws):
    workspace, _ = ws
    marker = f"stockade-{uuid.uuid4().hex}"

    async def main() -> None:
        async with stockade.AsyncSandbox(policy_for("workspace-write"),
                                         workspace=workspace) as sb:
            r = await sb.run(["echo", "async"])
            assert r.stdout == b"async\n"
            events = [e async for e in sb.stream(["sh", "-c", "echo a; echo b >&2"])]
            assert isinstance(events[-1], stockade.Result) and events[-1].exit_code == 0
            task = asyncio.ensure_future(sb.run(spawn_tree(marker)))
            await asyncio.sleep(1.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gone(marker, within=2)
            assert (await sb.run(["echo", "after"])).stdout == b"after\n"

    asyncio.run(main())
