"""`stockade daemon`: owns warm sandboxes on behalf of other processes of the same user.

Clients connect to a unix socket (mode 0600, in Stockade's 0700 state directory) and send one
JSON request line. The daemon knows the peer by what the kernel says of it (stockade/linux/
peer.py): its uid, and its namespaces, root, capabilities, no_new_privs, seccomp state and LSM
label read from its own `/proc` through its pidfd; a peer whose context is not the daemon's —
another user, or any process inside a sandbox or container — is refused (`peer_refused`)
before anything of its request is acted on. It then answers with JSON lines (see client.py and
docs/sessions.md). Sessions are named by the
client: a later request with the same session id reuses the warm sandbox, provided it asks for
the same policy and workspace (`session_mismatch` otherwise). A session idle for `idle` seconds
is torn down. A sandbox that will not boot is retried (3 attempts in all), then reported as
`session_boot_failed`.

Every sandbox is the daemon's own child (through the zygote, or a QEMU it started) and is
bound to the daemon's lifetime: the daemon only ever ends sandboxes it started (it closes their
lifelines or kills its own QEMU), and if it dies, even by SIGKILL, the kernel ends every one of
them. Each live sandbox also has a record in the launch ledger (its root process: boot id, pid,
start time), held under the daemon's lease; the next daemon reconciles the records a dead one
left, which kills any such process that somehow still runs, and reports them as reclaimed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from stockade.errors import StockadeError
from stockade.launch import registry
from stockade.lifecycle import removers, statedir
from stockade.lifecycle.ledger import Ledger
from stockade.linux import peer, servercheck
from stockade.policy import parse_policy, policy_to_document, preset
from stockade.session.errors import SessionError
from stockade.session.exchange import Output
from stockade.session.sandbox import Sandbox

IDLE_TIMEOUT = 300.0  # seconds
MAX_REQUEST = 8 << 20  # bytes in one request line
SOCKET_NAME = "daemon.sock"
RECORD_LABEL = "daemon-session"  # the ledger's name for a session sandbox's root process
_FIELDS = {"op", "session", "policy", "preset", "workspace", "argv", "cwd", "env", "timeout",
           "input"}


def default_socket() -> str:
    return os.path.join(statedir.state_dir(), SOCKET_NAME)


@dataclass
class _Entry:
    key: str
    sandbox: Sandbox | None = None
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    commands: int = 0
    boot: threading.Lock = field(default_factory=threading.Lock)
    record: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


class Daemon:
    def __init__(self, path: str | None = None, *, idle: float = IDLE_TIMEOUT,
                 check_peers: bool = True) -> None:
        """`check_peers` False (tests only, never set by the command line: it proves the
        evidence row that attacks the daemon can fail) serves a peer in any context."""
        self.path = path or default_socket()
        self.idle = idle
        self._check_peers = check_peers
        self._sessions: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._ledger = Ledger()
        self._context = peer.own_context()  # what a client must share with the daemon
        self.reclaimed = 0  # sandboxes of an earlier daemon whose records bind() settled
        self.replaced = ""  # why the socket bind() found and replaced was untrusted, if it was

    def bind(self) -> None:
        """Create the socket (0600, in a directory only this user can write), after settling
        the ledger records of sandboxes an earlier daemon left (see the module docstring)."""
        directory = os.path.dirname(os.path.abspath(self.path))
        statedir.ensure(directory)
        if os.path.lexists(self.path):
            try:
                if servercheck.answers(self.path):
                    raise SessionError("daemon_running",
                                       f"a daemon already listens on {self.path}")
            except servercheck.ServerUntrusted as exc:
                # Planted (the directory is this user's alone: statedir.ensure): its listener
                # is not ours to end, but once unlinked no client reaches it by this path.
                self.replaced = exc.why
            os.unlink(self.path)  # a stale socket of a dead daemon, or a planted one
        registry.load_record_kinds()  # (the kinds of this host's backends, before any is read)
        done = self._ledger.reconcile()
        self.reclaimed = sum(1 for kind, name in done.removed
                             if (kind, name) == ("process", RECORD_LABEL))
        listener = statedir.bind_socket(self.path)
        listener.listen(16)
        self._listener = listener

    def serve(self) -> None:
        """Accept clients until `stop()`; then end every sandbox."""
        if self._listener is None:
            self.bind()
        assert self._listener is not None
        threading.Thread(target=self._reap_idle, daemon=True).start()
        try:
            while not self._stopping.is_set():
                try:
                    conn, _ = self._listener.accept()
                except OSError:
                    break  # stop() closed the listener
                threading.Thread(target=self._client, args=(conn, peer.boottime()),
                                 daemon=True).start()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            # (serve() may have seen the flag after an accept and closed it already: EBADF)
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)

    # --- one client --------------------------------------------------------------------------

    def _client(self, conn: socket.socket, accepted: float) -> None:
        with conn, contextlib.suppress(OSError):  # the client went away (even mid-answer)
            self._answer(conn, _sender(conn), accepted)

    def _answer(self, conn: socket.socket, send: Callable[..., None], accepted: float) -> None:
        try:
            request = _read_request(conn)  # (first, so that a refused client hears why)
            try:
                if self._check_peers:
                    peer.check_peer(conn, self._context, accepted=accepted)
            except peer.PeerRefused as exc:
                raise SessionError("peer_refused", f"the daemon serves only processes of its "
                                   f"own user and context: {exc.why}") from None
            op = request.get("op")
            if op == "exec":
                self._exec(request, send, conn)
            elif op == "start":
                self._use(request, lambda sandbox: send(event="started"))
            elif op == "stop":
                send(event="stopped", stopped=self._end(_text(request, "session")))
            elif op == "list":
                send(event="sessions", sessions=self._list())
            else:
                raise SessionError("request_invalid", "op must be exec, start, stop or list")
        except StockadeError as exc:
            send(event="error", code=exc.code, message=exc.message)
        except (TypeError, ValueError) as exc:  # a field of the wrong kind
            send(event="error", code="request_invalid", message=exc.__class__.__name__)

    def _exec(self, request: dict, send: Callable[..., None], conn: socket.socket) -> None:
        argv = request.get("argv")
        data = request.get("input")

        def run(sandbox: Sandbox) -> None:
            events = sandbox.stream(
                argv if isinstance(argv, list) else [], cwd=request.get("cwd"),
                env=request.get("env"), timeout=request.get("timeout"),
                input=None if data is None else base64.b64decode(data),
                cancel=ClientEnded(conn))
            with contextlib.closing(events):  # (a client gone mid-send cancels it too)
                for event in events:
                    if isinstance(event, Output):
                        send(event="output", stream=event.stream,
                             data=base64.b64encode(event.data).decode())
                    else:
                        body = asdict(event)
                        body["stdout"] = base64.b64encode(event.stdout).decode()
                        body["stderr"] = base64.b64encode(event.stderr).decode()
                        send(event="result", result=body)

        self._use(request, run, command=True)

    def _use(self, request: dict, action: Callable[[Sandbox], None], *,
             command: bool = False) -> None:
        """Run `action` on the request's session, booting it (once) if needed; `command`
        counts it as one of the session's commands."""
        name = _text(request, "session")
        policy = (parse_policy(request["policy"], file="request") if request.get("policy")
                  else preset(request.get("preset") or "read-only"))
        workspace = request.get("workspace")
        key = json.dumps([policy_to_document(policy), workspace], sort_keys=True)
        with self._lock:
            entry = self._sessions.setdefault(name, _Entry(key))
            if entry.key != key:
                raise SessionError("session_mismatch", f"session {name!r} runs another policy "
                                   "or workspace; stop it first")
            entry.busy += 1
        try:
            with entry.boot:
                if entry.sandbox is None or entry.sandbox.closed:
                    _settle(entry)  # a lost sandbox's record
                    entry.sandbox = Sandbox(policy, workspace=workspace)
                    self._record(entry, entry.sandbox)
            action(entry.sandbox)
            if command:
                entry.commands += 1
        finally:
            with self._lock:
                entry.busy -= 1
                entry.last_used = time.monotonic()

    # --- lifecycle ---------------------------------------------------------------------------

    def _record(self, entry: _Entry, sandbox: Sandbox) -> None:
        """The sandbox's ledger record, held (leased) until the session ends."""
        try:
            record = entry.record.enter_context(self._ledger.launch(sandbox.request_id))
            record.add("process", RECORD_LABEL, removers.process_identity(sandbox.pid))
        except BaseException:
            sandbox.close()
            _settle(entry)
            raise

    def _end(self, name: str) -> bool:
        with self._lock:
            entry = self._sessions.pop(name, None)
        if entry is None or entry.sandbox is None:
            return False
        entry.sandbox.close()
        _settle(entry)
        return True

    def _list(self) -> list[dict]:
        now = time.monotonic()
        with self._lock:
            return [{"session": name, "ready": e.sandbox is not None and not e.sandbox.closed,
                     "busy": e.busy > 0, "commands": e.commands,
                     "idle": round(now - e.last_used, 3)}
                    for name, e in sorted(self._sessions.items())]

    def _reap_idle(self) -> None:
        while not self._stopping.wait(min(self.idle / 4, 1.0)):
            now = time.monotonic()
            with self._lock:
                idle = [name for name, e in self._sessions.items()
                        if not e.busy and now - e.last_used >= self.idle]
            for name in idle:
                self._end(name)

    def _shutdown(self) -> None:
        with self._lock:
            names = list(self._sessions)
        for name in names:
            self._end(name)
        if self._listener is not None:
            self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class ClientEnded(threading.Event):
    """A command's cancel event, set once its client has ended its side of the connection
    (shut down writing, closed it, or died): how a client cancels (docs/sessions.md). The
    session's exchange asks `is_set()` every few tens of milliseconds while the command runs,
    and each ask looks at the connection without waiting."""

    def __init__(self, conn: socket.socket) -> None:
        super().__init__()
        self._poller = select.poll()  # (EOF and any byte after the request both count)
        self._poller.register(conn, select.POLLIN | select.POLLRDHUP)

    def is_set(self) -> bool:
        if not super().is_set() and self._poller.poll(0):
            self.set()
        return super().is_set()


def _settle(entry: _Entry) -> None:
    """Drop the entry's record (its sandbox has ended; a failure leaves it to a reconcile)."""
    with contextlib.suppress(StockadeError):
        entry.record.close()


def _sender(conn: socket.socket) -> Callable[..., None]:
    def send(**fields: object) -> None:
        conn.sendall(json.dumps(fields).encode() + b"\n")
    return send


def _read_request(conn: socket.socket) -> dict:
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise SessionError("request_invalid", f"a request is at most {MAX_REQUEST} bytes")
    try:
        request = json.loads(data)
    except ValueError:
        raise SessionError("request_invalid", "the request is not one JSON line") from None
    if not isinstance(request, dict):
        raise SessionError("request_invalid", "the request is not a JSON object")
    unknown = sorted(set(request) - _FIELDS)
    if unknown:
        raise SessionError("request_invalid", f"unknown field {unknown[0][:64]!r}")
    return request


def _text(request: dict, key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise SessionError("request_invalid", f"{key} must be a short non-empty string")
    return value
