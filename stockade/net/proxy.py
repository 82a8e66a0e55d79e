"""Stockade's egress proxy: the only way out of an `allowlist` sandbox.

One unix-socket listener (a socket file, mode 0600, in a fresh private directory) speaks SOCKS5
when a client's first byte is 0x05 and HTTP otherwise (CONNECT tunnels and absolute-form plain
HTTP). Every destination goes through `Gate`; every denial is recorded.

Threading: an accept thread plus one thread per connection (two once it is a tunnel, one per
direction), all daemons, started and stopped from synchronous code. Blocking sockets keep each
handler a straight line; the bounds below keep a slow or hostile client from exhausting the
proxy: connections past `max_connections` are closed at once, a request head must arrive within
`handshake_timeout` (one deadline for the whole head, not per read) and within
`max_header_bytes`, dials give up after `connect_timeout`, tunnels close after `idle_timeout`
without traffic either way.

Several proxies share one process in the daemon (one per warm session), and so its descriptors:
all of them together hold at most what RLIMIT_NOFILE leaves after a reserve for the process's
own work (two descriptors per connection), and each at most a quarter of that, so that no
sandbox can starve the others or the daemon. A connection refused for either budget is closed
at once and recorded as a denial (`connection_limit`).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from stockade.errors import SetupError, UsageError
from stockade.net import http, socks
from stockade.net.gate import Dialer, Gate, Resolver, Verdict, dial
from stockade.net.log import DecisionLog
from stockade.net.relay import relay
from stockade.net.rules import Ruleset
from stockade.net.stream import Closed, Stream

_STOP_JOIN_SECONDS = 2.0
RESERVED_DESCRIPTORS = 128  # kept for the process's own work whatever its proxies hold
DESCRIPTORS_PER_CONNECTION = 2  # the client's, and the upstream's once it is a tunnel
SHARE = 4  # one proxy holds at most 1/SHARE of the process's connection budget


class _Descriptors:
    """The connections every proxy of this process holds together, against RLIMIT_NOFILE."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = 0

    @staticmethod
    def capacity() -> int:
        soft = 1 << 20  # (no descriptor limit binds sockets on Windows: they are handles)
        if sys.platform != "win32":
            import resource

            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            soft = soft if limit == resource.RLIM_INFINITY else limit
        return max(SHARE, (soft - RESERVED_DESCRIPTORS) // DESCRIPTORS_PER_CONNECTION)


_PROCESS = _Descriptors()


@dataclass(frozen=True)
class ProxyLimits:
    """Bounds on what one client can hold: connections, head size, and how long each stage
    may take (seconds). Past `max_connections`, new connections are closed unanswered."""

    max_connections: int = 256
    max_header_bytes: int = 16 * 1024
    handshake_timeout: float = 10.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0


class Proxy:
    """An allowlist proxy on a unix socket: `start()` returns its path, `stop()` removes it.

    `resolver` (host -> IP strings) replaces getaddrinfo, and `dialer` the connection to
    checked addresses, for tests; so does `unchecked` (see Gate). Denials are kept for
    `denials()` and appended to `log_path` (JSON lines) when given; with `log_all`, allowed
    and failed requests are logged too.
    """

    def __init__(self, allow: Iterable[str], deny: Iterable[str] = (), request_id: str = "", *,
                 log_path: str | os.PathLike[str] | None = None, log_all: bool = False,
                 resolver: Resolver | None = None, limits: ProxyLimits = ProxyLimits(),
                 socket_dir: str | None = None, dialer: Dialer | None = None,
                 unchecked: frozenset[str] = frozenset()) -> None:
        self.gate = Gate(Ruleset(allow, deny), resolver, unchecked)
        self._dial = dialer or dial
        self.limits = limits
        self._log = DecisionLog(request_id, None if log_path is None else os.fspath(log_path),
                                log_all=log_all)
        self._socket_dir = socket_dir
        self._lock = threading.Lock()
        self._live: dict[threading.Thread, list[socket.socket]] = {}
        self._stopping = False
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self.socket_path: str | None = None

    def start(self, listener: socket.socket | None = None) -> str | None:
        """Serve in the background. Without `listener`, listen on a new socket file and return
        its path; with one (e.g. a loopback socket made inside a sandbox's network namespace
        and passed out), serve on it and return None."""
        if self._listener is not None or self._stopping:
            raise UsageError("a proxy is started once")
        if listener is None:
            listener = self._listen_on_file()
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, name="stockade-proxy",
                                          daemon=True)
        self._acceptor.start()
        return self.socket_path

    def _listen_on_file(self) -> socket.socket:
        directory = tempfile.mkdtemp(prefix="stockade-proxy-", dir=self._socket_dir)
        path = os.path.join(directory, "proxy.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(128)
        except OSError as exc:
            listener.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise SetupError("proxy_listen_failed", f"cannot listen on {path}: {exc}",
                             stage="proxy") from None
        self.socket_path = path
        return listener

    def stop(self) -> None:
        """Stop accepting, cut every connection, remove the socket file. Idempotent."""
        with self._lock:
            if self._stopping or self._listener is None:
                return
            self._stopping = True
            live = dict(self._live)
        assert self._acceptor is not None
        _shutdown(self._listener)  # wakes the acceptor out of accept()
        self._acceptor.join(_STOP_JOIN_SECONDS)
        self._listener.close()
        for sockets in live.values():
            for sock in sockets:
                _shutdown(sock)
        deadline = time.monotonic() + _STOP_JOIN_SECONDS
        for thread in live:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.socket_path is not None:
            shutil.rmtree(os.path.dirname(self.socket_path), ignore_errors=True)
        self._log.close()

    def denials(self) -> list[dict[str, Any]]:
        """Every denial so far (up to the log's in-memory cap), as JSON-ready dicts."""
        return self._log.denials()

    @property
    def dropped_denials(self) -> int:
        """Denials past the in-memory cap: in the log file, not in `denials()`."""
        return self._log.dropped

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: let connections finish
                continue
            thread = threading.Thread(target=self._serve, args=(conn,),
                                      name="stockade-proxy-connection", daemon=True)
            capacity = _PROCESS.capacity()
            with self._lock, _PROCESS.lock:
                own = len(self._live) < min(self.limits.max_connections,
                                            max(1, capacity // SHARE))
                admitted = not self._stopping and own and _PROCESS.held < capacity
                if admitted:
                    self._live[thread] = [conn]
                    _PROCESS.held += 1
            if not admitted:
                conn.close()
                if self._stopping:
                    return
                if not own or _PROCESS.held >= capacity:
                    self._record("connection", Verdict(
                        "deny", "", 0, "connection_limit",
                        "too many connections at once (this sandbox's share of the "
                        "process's descriptors)" if not own else
                        "too many connections at once in this process"))
                continue
            try:
                thread.start()
            except RuntimeError:  # no more threads: refuse this one, keep serving
                with self._lock, _PROCESS.lock:
                    del self._live[thread]
                    _PROCESS.held -= 1
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            stream = Stream(conn, time.monotonic() + self.limits.handshake_timeout)
            if stream.peek() == 5:
                self._serve_socks(conn, stream)
            else:
                self._serve_http(conn, stream)
        except OSError:
            pass  # the client went away, ran out of time, or the proxy is stopping
        finally:
            with self._lock, _PROCESS.lock:
                sockets = self._live.pop(threading.current_thread())
                _PROCESS.held -= 1
            for sock in sockets:
                sock.close()

    def _serve_socks(self, conn: socket.socket, stream: Stream) -> None:
        try:
            command, host, port = socks.read_request(stream, conn)
        except socks.Refused as exc:
            conn.sendall(socks.reply(exc.code))
            return
        if command != socks.CONNECT:
            self._record("socks5", Verdict("deny", host[:255], port, "command_not_supported",
                                           "only CONNECT is supported (no BIND, no UDP)"))
            conn.sendall(socks.reply(socks.COMMAND_NOT_SUPPORTED))
            return
        verdict, upstream = self._open("socks5", host, port)
        if upstream is None:
            code = (socks.NOT_ALLOWED if verdict.decision == "deny"
                    else socks.REFUSED if verdict.reason == "connection_refused"
                    else socks.HOST_UNREACHABLE)
            conn.sendall(socks.reply(code))
            return
        conn.sendall(socks.reply(socks.SUCCEEDED))
        self._tunnel(conn, upstream, stream.rest())

    def _serve_http(self, conn: socket.socket, stream: Stream) -> None:
        try:
            request = http.read_request(stream, self.limits.max_header_bytes)
        except http.HttpError as exc:
            conn.sendall(http.response(exc.status, f"stockade proxy: {exc.message}\n"))
            return
        protocol = "connect" if request.method == "CONNECT" else "http"
        verdict, upstream = self._open(protocol, request.host, request.port)
        if upstream is None:
            denied = verdict.decision == "deny"
            conn.sendall(http.response(
                403 if denied else 502,
                f"stockade proxy: {verdict.host}:{verdict.port} "
                f"{'denied' if denied else 'unreachable'} ({verdict.reason}): {verdict.message}\n"))
            return
        if protocol == "connect":
            conn.sendall(http.ESTABLISHED)
            early = stream.rest()
        else:
            early = http.forward_head(request, verdict.host) + stream.rest()
        self._tunnel(conn, upstream, early)

    def _open(self, protocol: str, host: str, port: int) -> tuple[Verdict, socket.socket | None]:
        """Decide, dial if allowed, record the outcome."""
        verdict = self.gate.decide(host, port)
        upstream = None
        if verdict.decision == "allow":
            try:
                upstream = self._dial(verdict.addresses, port, self.limits.connect_timeout,
                                      self._track)
            except OSError as exc:
                refused = isinstance(exc, ConnectionRefusedError)
                verdict = replace(verdict, decision="error",
                                  reason="connection_refused" if refused else "connect_failed",
                                  message=f"cannot connect: {exc}")
        self._record(protocol, verdict)
        return verdict, upstream

    def _track(self, sock: socket.socket) -> None:
        """Register an upstream socket with this connection, so `stop()` can cut it."""
        with self._lock:
            if self._stopping:
                raise Closed("proxy stopping")
            self._live[threading.current_thread()].append(sock)

    def _tunnel(self, conn: socket.socket, upstream: socket.socket, early: bytes) -> None:
        if early:
            upstream.sendall(early)
        relay(conn, upstream, self.limits.idle_timeout)

    def _record(self, protocol: str, verdict: Verdict) -> None:
        self._log.record(protocol=protocol, host=verdict.host, port=verdict.port,
                         decision=verdict.decision, reason=verdict.reason,
                         message=verdict.message, rule=verdict.rule, address=verdict.address)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
