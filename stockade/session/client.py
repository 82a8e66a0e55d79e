"""A client of `stockade daemon`: run commands in the daemon's named warm sandboxes.

    >>> client = DaemonClient()
    >>> client.run("build", ["make"], preset="workspace-write", workspace="proj").exit_code

Each call is one connection carrying one JSON request line; the daemon answers with JSON lines:
`{"event": "output", "stream", "data" (base64)}` as output arrives, then `{"event": "result",
"result"}` (a Result's fields, output base64) — or `{"event": "error", "code", "message"}`.
A client cancels a command by ending its side of the connection (shutdown for writing, or
closing it): the daemon kills the command and still sends what remains, its Result last.

Nothing is sent before the daemon is known for what it is (stockade/linux/servercheck.py: the
socket's directory is this user's alone, and the process that listens has this process's own
context, as the kernel tells it): a socket planted by a sandbox is refused, SessionError
`server_untrusted`, having heard nothing.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from stockade.errors import StartError
from stockade.launch.pump import CANCEL_POLL
from stockade.launch.result import Result, Violation
from stockade.linux import servercheck
from stockade.policy import Policy, policy_to_document
from stockade.session import daemon
from stockade.session.errors import SessionError
from stockade.session.exchange import GRACE, Output
from stockade.session.protocol import COMMAND_CODES

CANCEL_WAIT = GRACE + 5.0  # seconds a cancelled command's end may take (the daemon's bound + 5)


class DaemonClient:
    def __init__(self, path: str | None = None, *, check_server: bool = True) -> None:
        """`check_server` False (tests only: it proves the evidence row that plants a daemon
        can fail) talks to whatever listens on the socket."""
        self.path = path or daemon.default_socket()
        self._check_server = check_server

    def stream(self, session: str, argv: Sequence[str], *, policy: Policy | None = None,
               preset: str | None = None, workspace: str | os.PathLike | None = None,
               cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
               timeout: float | None = None, input: bytes | None = None,
               cancel: threading.Event | None = None) -> Iterator[Output | Result]:
        """Output chunks as they arrive, then the Result (as Sandbox.stream). Setting `cancel`
        kills the command in the session: its Result (`cancelled`) still comes, within
        CANCEL_WAIT seconds (SessionError `daemon_unresponsive` otherwise)."""
        request = {
            "op": "exec", "session": session, "argv": list(argv),
            **_source(policy, preset, workspace),
            "cwd": None if cwd is None else os.fspath(cwd), "env": dict(env or {}),
            "timeout": timeout,
            "input": None if input is None else base64.b64encode(input).decode(),
        }
        for reply in self._exchange(request, cancel):
            if reply["event"] == "output":
                yield Output(reply["stream"], base64.b64decode(reply["data"]))
            elif reply["event"] == "result":
                yield _result(reply["result"])

    def run(self, session: str, argv: Sequence[str], **kwargs: object) -> Result:
        result = None
        for event in self.stream(session, argv, **kwargs):  # type: ignore[arg-type]
            result = event
        if not isinstance(result, Result):
            raise SessionError("session_lost", "the daemon ended without a result")
        return result

    def start(self, session: str, *, policy: Policy | None = None, preset: str | None = None,
              workspace: str | os.PathLike | None = None) -> None:
        """Boot the session's sandbox now (later `run`s find it warm)."""
        list(self._exchange({"op": "start", "session": session,
                             **_source(policy, preset, workspace)}))

    def stop(self, session: str) -> bool:
        return next(self._exchange({"op": "stop", "session": session}))["stopped"]

    def sessions(self) -> list[dict]:
        return next(self._exchange({"op": "list"}))["sessions"]

    def _exchange(self, request: dict, cancel: threading.Event | None = None) -> Iterator[dict]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                if self._check_server:
                    servercheck.connect(conn, self.path)
                else:
                    conn.connect(self.path)
            except OSError as exc:
                raise SessionError("daemon_unavailable",
                                   f"no daemon at {self.path} ({exc.strerror})") from None
            except servercheck.ServerUntrusted as exc:
                raise SessionError("server_untrusted", f"not using {self.path} ({exc.why}): "
                                   "nothing was sent to it") from None
            conn.sendall(json.dumps(request).encode() + b"\n")
            lines = _lines(conn) if cancel is None else _cancellable_lines(conn, cancel)
            for line in lines:
                reply = json.loads(line)
                if reply["event"] == "error":
                    error = StartError if reply["code"] in COMMAND_CODES else SessionError
                    raise error(reply["code"], reply["message"])
                yield reply


def _lines(conn: socket.socket) -> Iterator[bytes]:
    with conn.makefile("rb") as replies:
        yield from replies


def _cancellable_lines(conn: socket.socket, cancel: threading.Event) -> Iterator[bytes]:
    """The daemon's reply lines, looking at `cancel` every CANCEL_POLL seconds: once it is set,
    our side of the connection ends (the daemon's cue to kill the command), and the rest of
    the replies must come within CANCEL_WAIT seconds."""
    buffered = b""
    give_up = None
    conn.settimeout(CANCEL_POLL)
    while True:
        if give_up is None and cancel.is_set():
            conn.shutdown(socket.SHUT_WR)
            give_up = time.monotonic() + CANCEL_WAIT
        if give_up is not None and time.monotonic() >= give_up:
            raise SessionError("daemon_unresponsive", "the daemon did not end the cancelled "
                               f"command within {CANCEL_WAIT:g}s")
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            if buffered:
                yield buffered
            return
        *complete, buffered = (buffered + chunk).split(b"\n")
        for line in complete:
            yield line + b"\n"


def _source(policy: Policy | None, preset: str | None,
            workspace: str | os.PathLike | None) -> dict:
    return {"policy": None if policy is None else policy_to_document(policy), "preset": preset,
            "workspace": None if workspace is None else os.path.abspath(workspace)}


def _result(body: dict) -> Result:
    body = dict(body)
    body["stdout"] = base64.b64decode(body["stdout"])
    body["stderr"] = base64.b64decode(body["stderr"])
    body["violations"] = tuple(Violation(**v) for v in body["violations"])
    return Result(**body)
