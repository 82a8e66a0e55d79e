"""Clients trust a Stockade server only on the kernel's word (issue 29, G1): a sandbox that can
write where the host's clients look for the state directory plants cli.sock and daemon.sock
there. The host's `stockade run` must check who listens before it sends a byte, and run its
command itself; `stockade session` must refuse, typed. The planted servers are real processes
inside a real sandbox, and say what they heard (evidence/attacks/helper_planted.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, policy_for

from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux import servercheck
from stockade.linux.backend import LinuxBackend

pytestmark = [pytest.mark.linux, pytest.mark.usefixtures("linux")]
REPO = str(Path(__file__).resolve().parent.parent)
ATTACKS = os.path.join(REPO, "stockade", "evidence", "attacks")
SECRET = "canary-secret-of-the-host-client"


def stockade(*args: str, state: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(state),
           "HOST_ONLY_SECRET": SECRET}
    return subprocess.run([sys.executable, "-m", "stockade", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


class Planted:
    """helper_planted.py running inside a sandbox whose workspace is `ws`: it makes `state`
    (in the workspace) and listens there until `done` appears."""

    def __init__(self, ws: Path) -> None:
        self.state, self.done = ws / "state", ws / "done"
        request = compile_policy(
            policy_for("workspace-write", read=(ATTACKS,)),
            [PYTHON, os.path.join(ATTACKS, "helper_planted.py"), "planted-marker",
             str(self.state), str(self.done)], CompileContext.current(ws))
        self.result = None
        self.thread = threading.Thread(
            target=lambda: setattr(self, "result", execute(LinuxBackend(), request)))
        self.thread.start()
        deadline = time.monotonic() + 60
        while not all((self.state / name).exists() for name in ("cli.sock", "daemon.sock")):
            assert self.thread.is_alive() and time.monotonic() < deadline, self.result
            time.sleep(0.05)

    def heard(self) -> str:
        """End it; what it printed."""
        self.done.touch()
        self.thread.join(90)
        assert self.result is not None and self.result.exit_code == 0, self.result
        return self.result.stdout.decode()


def test_a_run_never_talks_to_a_server_planted_by_a_sandbox(tmp_path):
    ws, host = tmp_path / "ws", tmp_path / "host"
    ws.mkdir()
    host.mkdir()
    planted = Planted(ws)
    try:
        done = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh",
                        "-c", "echo ran > made; exit 3", state=planted.state, cwd=host)
        listed = stockade("session", "list", state=planted.state, cwd=host)
    finally:
        heard = planted.heard()
    # The run happened here, for real (the planted server would have answered 0, unrun).
    assert done.returncode == 3, done.stderr
    assert (host / "made").read_text() == "ran\n"
    assert "server_untrusted" in done.stderr and SECRET not in done.stderr
    assert listed.returncode != 0 and listed.stdout == ""
    assert listed.stderr.startswith("stockade: server_untrusted: "), listed.stderr
    assert "another" in listed.stderr and SECRET not in listed.stderr
    # Both clients connected and sent nothing at all.
    assert "hear the host's client on a planted cli.sock: denied NOTHING_SENT" in heard, heard
    assert "hear the host's client on a planted daemon.sock: denied NOTHING_SENT" in heard, heard


@pytest.mark.parametrize("mode", [0o770, 0o703])
def test_a_server_in_a_directory_others_can_write_is_not_used(tmp_path, mode):
    """A listener of this very context (the test process) whose directory others could write
    (they could have replaced it): neither client sends it anything (and the run, here, then
    refuses that state directory for its ledger too)."""
    state, host = tmp_path / "state", tmp_path / "host"
    state.mkdir()
    host.mkdir()
    state.chmod(mode)
    heard = bytearray()
    listeners = []
    for name in ("cli.sock", "daemon.sock"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(state / name))
        listener.listen(8)
        listener.settimeout(0.1)
        listeners.append(listener)
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            for listener in listeners:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(2)
                    try:
                        heard.extend(conn.recv(65536))
                    except TimeoutError:
                        pass

    thread = threading.Thread(target=listen)
    thread.start()
    try:
        done = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh",
                        "-c", "echo ran > made", state=state, cwd=host)
        listed = stockade("session", "list", state=state, cwd=host)
    finally:
        stop.set()
        thread.join(10)
        for listener in listeners:
            listener.close()
    assert done.stderr.startswith("stockade: server_untrusted: "), done.stderr
    assert "writable by other users): nothing was sent" in done.stderr
    assert done.returncode == 70 and "ledger_unusable" in done.stderr
    assert listed.returncode != 0 and "writable by other users" in listed.stderr
    assert listed.stderr.startswith("stockade: server_untrusted: "), listed.stderr
    assert bytes(heard) == b""


def test_a_planted_socket_neither_stops_the_daemon_nor_hears_it(tmp_path):
    """A sandbox plants cli.sock and daemon.sock in a directory that becomes the state
    directory of a real `stockade daemon` (the directory is the user's alone: a sandbox of
    the user made it). The daemon's start used to take the planted daemon.sock for a live
    daemon (`daemon_running`: failed before) after connecting to it unchecked; now it checks
    who listens, replaces both sockets and says so, and serves: a session list and a run go
    to the real servers, and the planted listeners heard nothing."""
    ws, host = tmp_path / "ws", tmp_path / "host"
    ws.mkdir()
    host.mkdir()
    planted = Planted(ws)
    env = {**os.environ, "PYTHONPATH": REPO, "STOCKADE_STATE_DIR": str(planted.state)}
    daemon = None
    try:
        daemon = subprocess.run([sys.executable, "-m", "stockade", "daemon", "--background"],
                                env=env, capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
        assert daemon.returncode == 0, daemon.stderr
        assert "replaced a socket at" in daemon.stderr and "sent nothing" in daemon.stderr
        listed = stockade("session", "list", state=planted.state, cwd=host)
        _until_served(planted.state / "cli.sock")  # (the CLI server binds after its attestation)
        done = stockade("run", "--preset", "workspace-write", "--workspace", ".", "--", "sh",
                        "-c", "echo ran > made; exit 3", state=planted.state, cwd=host)
    finally:
        heard = planted.heard()
        if daemon is not None and daemon.returncode == 0:
            os.kill(int(daemon.stdout), signal.SIGTERM)
    assert listed.returncode == 0 and "server_untrusted" not in listed.stderr, listed.stderr
    assert done.returncode == 3 and (host / "made").read_text() == "ran\n", done.stderr
    assert "server_untrusted" not in done.stderr, done.stderr
    for name in ("cli.sock", "daemon.sock"):
        assert f"on a planted {name}: denied NOTHING_SENT" in heard, heard


def _until_served(path: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(servercheck.ServerUntrusted):
            if servercheck.answers(str(path)):
                return
        assert time.monotonic() < deadline, f"no server of ours on {path}"
        time.sleep(0.05)
