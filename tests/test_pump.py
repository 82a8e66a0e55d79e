"""The pump, both ways: the selector (Linux) and a thread per stream (what Windows uses, since it
cannot select on pipes; written platform-neutrally, so tested here too). Driven over a plain,
unsandboxed child: bounded capture, stdin fed, the deadline and cancel kill the child."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from stockade.launch import pump
from stockade.launch.backend import Exit, Handle
from stockade.launch.pump import drive


class Plain(Handle):
    """A child process, not sandboxed: enough for the pump."""

    def __init__(self, code: str, *, stdin: bool = False) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stdin, self.stdout, self.stderr = (self.process.stdin, self.process.stdout,
                                                self.process.stderr)

    def wait(self, timeout: float | None = None) -> Exit | None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return Exit(None, -code) if code < 0 else Exit(code, None)

    def kill(self) -> None:
        self.process.kill()


class JobLike(Plain):
    """A child whose wait() ends its whole tree once the child itself has exited, as the
    Windows backend's does (the Job is terminated): a process it left behind goes then."""

    def __init__(self, code: str, *, ends_tree: bool = True) -> None:
        self.ends_tree = ends_tree
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        self.stdin, self.stdout, self.stderr = None, self.process.stdout, self.process.stderr

    def wait(self, timeout: float | None = None) -> Exit | None:
        end = super().wait(timeout)
        if end is not None and self.ends_tree:
            self.end_tree()
        return end

    def end_tree(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@pytest.fixture(params=[False, True], ids=["selector", "threads"])
def threaded(request) -> bool:
    return request.param


def test_output_is_captured_within_the_limit_and_the_rest_drained(threaded):
    handle = Plain("import os; os.write(1, b'x' * 300000); os.write(2, b'err'); raise "
                   "SystemExit(3)")
    done = drive(handle, input=None, limit=1000, timeout=30, cancel=None, threaded=threaded)
    assert done.end == Exit(3, None)
    assert (bytes(done.stdout.data), done.stdout.truncated) == (b"x" * 1000, True)
    assert (bytes(done.stderr.data), done.stderr.truncated) == (b"err", False)
    assert not (done.timed_out or done.cancelled)


@pytest.mark.parametrize("size", [0, 5, 1 << 20])
def test_stdin_is_fed_whole_and_closed(threaded, size):
    data = bytes(range(256)) * (size // 256) + b"y" * (size % 256)
    handle = Plain("import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())", stdin=True)
    done = drive(handle, input=data, limit=2 << 20, timeout=30, cancel=None, threaded=threaded)
    assert done.end == Exit(0, None) and bytes(done.stdout.data) == data


def test_a_command_that_stops_reading_stdin_is_its_business(threaded):
    handle = Plain("import sys; sys.stdin.close(); print('done')", stdin=True)
    done = drive(handle, input=b"z" * (4 << 20), limit=100, timeout=30, cancel=None,
                 threaded=threaded)
    assert done.end == Exit(0, None) and bytes(done.stdout.data) == b"done\n"


def test_the_deadline_kills_the_child(threaded):
    handle = Plain("import time; print('started', flush=True); time.sleep(60)")
    done = drive(handle, input=None, limit=100, timeout=0.5, cancel=None, threaded=threaded)
    assert done.timed_out and not done.cancelled
    assert done.end == Exit(None, signal.SIGKILL) and bytes(done.stdout.data) == b"started\n"


def test_cancel_kills_the_child(threaded):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    handle = Plain("import time; time.sleep(60)")
    done = drive(handle, input=None, limit=100, timeout=None, cancel=cancel, threaded=threaded)
    assert done.cancelled and not done.timed_out and done.end == Exit(None, signal.SIGKILL)


class Stubborn(Plain):
    """A child that a kill() ends only once repeated a second after the first: as a sandbox
    whose first kill asks its pid 1 to end it, and pid 1 does not (issue 29, W1)."""

    def __init__(self) -> None:
        super().__init__("import time; time.sleep(60)")
        self.kills: list[float] = []

    def kill(self) -> None:
        self.kills.append(time.monotonic())
        if self.kills[-1] - self.kills[0] >= 1.0:
            super().kill()


@pytest.mark.parametrize("end", ["timeout", "cancel"])
def test_the_kill_is_repeated_until_the_tree_ends_without_spinning(threaded, end):
    """After the deadline or cancel, kill() is called again and again (a backend forces the
    end of a tree that outlives its first kill), every KILL_POLL: not in a busy loop."""
    handle = Stubborn()
    cancel = threading.Event()
    if end == "cancel":
        threading.Timer(0.2, cancel.set).start()
    done = drive(handle, input=None, limit=100, timeout=0.2 if end == "timeout" else None,
                 cancel=cancel, threaded=threaded)
    assert done.end == Exit(None, signal.SIGKILL)
    assert done.timed_out if end == "timeout" else done.cancelled
    assert 2 <= len(handle.kills) <= 2 + 1.5 / pump.KILL_POLL, len(handle.kills)

def test_relayed_output_is_cut_at_the_limit(threaded, tmp_path):
    """Issue 30: what is relayed to a descriptor (the CLI's stdout, a file the API was given)
    counts against the same limit as what is captured: the rest is drained and flagged."""
    code = "import os; [os.write(1, b'x' * 4096) for _ in range(64)]; os.write(2, b'e' * 9000)"
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        done = drive(Plain(code), input=None, limit=1000, timeout=30, cancel=None,
                     threaded=threaded, outputs=(out.fileno(), err.fileno()))
    assert done.end.exit_code == 0
    assert (tmp_path / "out").read_bytes() == b"x" * 1000
    assert (tmp_path / "err").read_bytes() == b"e" * 1000
    assert done.stdout.truncated and done.stderr.truncated


BACKGROUND = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
              "'import time; time.sleep(60)']); print('done', flush=True); sys.exit(4)")


def test_a_background_process_holding_stdout_ends_with_the_command_on_windows():
    """Issue 31, D8: the threads waited for the streams to end before asking wait(), which is
    what ends the rest of the tree on Windows, so a background process holding stdout kept the
    run until its deadline. Now the command's exit ends it, and what it wrote is kept."""
    code = BACKGROUND
    started = time.monotonic()
    done = drive(JobLike(code), input=None, limit=100, timeout=20, cancel=None, threaded=True)
    assert not done.timed_out and time.monotonic() - started < 10
    assert done.end == Exit(4, None) and bytes(done.stdout.data) == b"done\n"
    assert not done.stdout.truncated


def test_a_stream_still_open_after_the_tree_is_gone_is_cut_after_a_bounded_drain(monkeypatch):
    """If a stream outlives wait() (a tree the Job could not end), the threads drain it for
    DRAIN seconds at most; then it is cut and flagged, and nothing more is taken in."""
    monkeypatch.setattr(pump, "DRAIN", 0.3)
    handle = JobLike(BACKGROUND, ends_tree=False)
    try:
        done = drive(handle, input=None, limit=100, timeout=20, cancel=None, threaded=True)
    finally:
        handle.end_tree()
    assert not done.timed_out and done.end == Exit(4, None)
    assert bytes(done.stdout.data) == b"done\n" and done.stdout.truncated
