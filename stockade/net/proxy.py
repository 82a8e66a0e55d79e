"""Stockade's egress proxy: the only way out of an `allowlist` sandbox.

One unix-socket listener (a socket file, mode 0600, in a fresh private directory) speaks SOCKS5
when a client's first byte is 0x05 and HTTP otherwise (CONNECT tunnels and absolute-form plain
HTTP). Every destination goes through `Gate`; every denial is recorded. With credentials or
HTTP rules, requests are also read and judged (`stockade.net.inspect`).

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
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from stockade.errors import SetupError, UsageError
from stockade.net import http, socks
from stockade.net.gate import Dialer, Gate, Resolver, Verdict, dial
from stockade.net.inspect import (
    WITHHELD,
    FramingError,
    Inspector,
    Refusal,
    forward_body,
    forward_response,
    framing,
)
from stockade.net.log import DecisionLog
from stockade.net.relay import relay
from stockade.net.rules import Ruleset, target_host
from stockade.net.stream import Closed, Stream, TooLarge

if TYPE_CHECKING:
    from stockade.net.approve import Approval
    from stockade.net.authority import Authority

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
    checked addresses, for tests; so does `unchecked` (see Gate and Inspector). Denials are
    kept for `denials()` and appended to `log_path` (JSON lines) when given; with `log_all`,
    allowed and failed requests are logged too.

    With an `inspector` that has credentials or HTTP rules (inspect.py), plain HTTP is read
    and judged, and HTTPS to the hosts it names is intercepted with `authority`'s
    certificates and sent on verified by `upstream_tls` (default: the system's trust store);
    SOCKS5 to those hosts is refused (a SOCKS tunnel cannot be read as HTTP). With an
    `approval` (approve.py), a destination outside the allow list is asked about.
    """

    def __init__(self, allow: Iterable[str], deny: Iterable[str] = (), request_id: str = "", *,
                 log_path: str | os.PathLike[str] | None = None, log_all: bool = False,
                 resolver: Resolver | None = None, limits: ProxyLimits = ProxyLimits(),
                 socket_dir: str | None = None, dialer: Dialer | None = None,
                 unchecked: frozenset[str] = frozenset(), inspector: Inspector | None = None,
                 authority: Authority | None = None,
                 upstream_tls: ssl.SSLContext | None = None,
                 approval: Approval | None = None) -> None:
        self._inspector = inspector if inspector is not None and inspector.active else None
        if self._inspector is not None:
            self._inspector.unchecked = unchecked
        self.gate = Gate(Ruleset(allow, deny), resolver, unchecked, approval,
                         self._credential_names)
        if self._inspector is not None and authority is None:
            raise UsageError("a proxy that reads requests needs an authority for HTTPS")
        self._authority = authority
        self._upstream_tls = upstream_tls
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
        if self._inspector is not None:
            refusal = self._inspector.in_name(host)
            name = _name(host)
            if refusal is None and name and self._inspector.intercepts(name, port):
                refusal = Refusal("socks_to_inspected_host", "network.credentials or "
                                  "network.http name this host: its requests must be read, so "
                                  "reach it through the HTTP proxy (HTTPS_PROXY), not SOCKS5")
            if refusal is not None:
                self._refuse("socks5", name or host[:255], port, refusal)
                conn.sendall(socks.reply(socks.NOT_ALLOWED))
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
        length: int | None = 0
        if self._inspector is not None:
            refusal, length = self._inspect(request, tls=False)
            if refusal is not None:
                self._refuse(protocol, _name(request.host) or request.host[:255],
                             request.port, refusal)
                conn.sendall(_refused(refusal))
                return
        verdict, upstream = self._open(protocol, request.host, request.port)
        if upstream is None:
            denied = verdict.decision == "deny"
            conn.sendall(http.response(
                403 if denied else 502,
                f"stockade proxy: {verdict.host}:{verdict.port} "
                f"{'denied' if denied else 'unreachable'} ({verdict.reason}): {verdict.message}\n"))
            return
        if self._inspector is not None:
            if protocol == "http":
                self._forward(conn, stream, upstream, request, verdict.host, length)
                return
            if self._inspector.intercepts(verdict.host, request.port):
                self._intercept(conn, stream, upstream, verdict)
                return
        if protocol == "connect":
            conn.sendall(http.ESTABLISHED)
            early = stream.rest()
        else:
            early = http.forward_head(request, verdict.host) + stream.rest()
        self._tunnel(conn, upstream, early)

    def _credential_names(self, host: str, port: int) -> tuple[str, ...]:
        """The credentials whose host `host`:`port` is (what an approval would let it use)."""
        if self._inspector is None:
            return ()
        return tuple(i.name for i in self._inspector.injections_for(host, port))

    def _inspect(self, request: http.Request, *, tls: bool) -> tuple[Refusal | None, int | None]:
        """The inspector's refusal of a request head (and the body's framing)."""
        assert self._inspector is not None
        refusal = self._inspector.in_name(request.host)
        name = _name(request.host)
        if refusal is not None or request.method == "CONNECT" or not name:
            return refusal, 0  # (an invalid host: the gate refuses it)
        refusal = self._inspector.judge(request, name, request.port, tls=tls)
        if refusal is not None:
            return refusal, 0
        try:
            return None, framing(request, lenient="framing" in self._inspector.unchecked)
        except FramingError as exc:
            return exc.refusal(), 0

    def _forward(self, client: socket.socket, stream: Stream, upstream: socket.socket,
                 request: http.Request, host: str, length: int | None) -> None:
        """Send a read request's head (its credential in place) and exactly its framed body,
        then pass the response back; nothing else the client sends goes upstream."""
        assert self._inspector is not None
        protocol = "https" if isinstance(upstream, ssl.SSLSocket) else "http"
        upstream.sendall(self._inspector.forward_head(request, host, request.port))
        scanner = self._inspector.body_scanner(host, request.port)
        try:
            refusal = forward_body(stream, length, upstream.sendall, scanner,
                                   self.limits.idle_timeout)
        except TooLarge:
            refusal = FramingError("a chunk size line too long").refusal()
        if refusal is not None:
            self._refuse(protocol, host, request.port, refusal)
            client.sendall(_refused(refusal))
            return
        client.settimeout(self.limits.idle_timeout)
        withholder = self._inspector.withholder(host, request.port)
        if withholder.injection is None:  # (no secret to keep out: the response as it comes)
            upstream.settimeout(self.limits.idle_timeout)
            while data := upstream.recv(_RESPONSE_CHUNK):
                client.sendall(data)
            return
        try:
            refusal = forward_response(Stream(upstream, 0.0), client.sendall, withholder,
                                       request.method, self.limits.max_header_bytes,
                                       self.limits.idle_timeout)
        except TooLarge:
            refusal = withholder.unreadable("a response head or chunk line over the size limit")
        except Closed:
            return  # (the server closed mid-response: the client sees it cut)
        if refusal is not None:  # (what came before the secret went; the rest never does)
            self._refuse(protocol, host, request.port, refusal)
            if refusal.reason == "credential_response_unreadable":  # (judged before its head)
                client.sendall(_refused(refusal))

    def _intercept(self, conn: socket.socket, stream: Stream, upstream: socket.socket,
                   verdict: Verdict) -> None:
        """HTTPS to a host the inspector names: TLS with the client under a leaf of the
        launch's CA, one request read and judged, sent on over TLS verified upstream."""
        assert self._inspector is not None and self._authority is not None
        if stream.rest():  # (a TLS client waits for the 200 before its first byte)
            return
        conn.sendall(http.ESTABLISHED)
        conn.settimeout(self.limits.handshake_timeout)
        try:
            client = self._hold(self._authority.issue(verdict.host).wrap_socket(
                conn, server_side=True))
        except (ssl.SSLError, OSError) as exc:
            self._record("https", replace(verdict, decision="error", reason="client_tls_failed",
                                          message=f"the client's TLS failed (does it trust "
                                          f"the launch's CA?): {exc}"))
            return
        inner = Stream(client, time.monotonic() + self.limits.handshake_timeout)
        port = verdict.port
        try:
            request = http.read_request(inner, self.limits.max_header_bytes,
                                        tunnel=(verdict.host, port))
        except http.HttpError as exc:
            self._refuse("https", verdict.host, port, Refusal(exc.reason, exc.message,
                                                              status=exc.status))
            client.sendall(http.response(exc.status, f"stockade proxy: {exc.message}\n"))
            return
        refusal, length = self._inspect(request, tls=True)
        if refusal is not None:
            self._refuse("https", verdict.host, port, refusal)
            client.sendall(_refused(refusal))
            return
        upstream.settimeout(self.limits.connect_timeout)
        try:
            secure = self._hold((self._upstream_tls or _system_tls()).wrap_socket(
                upstream, server_hostname=verdict.host.strip("[]")))
        except (ssl.SSLError, OSError) as exc:
            self._record("https", replace(verdict, decision="error",
                                          reason="upstream_tls_failed",
                                          message=f"the host's TLS failed verification: {exc}"))
            client.sendall(http.response(502, f"stockade proxy: {verdict.host}:{port} "
                                              "failed TLS verification\n"))
            return
        self._forward(client, inner, secure, request, verdict.host, length)

    def _hold(self, sock: ssl.SSLSocket) -> ssl.SSLSocket:
        """Register a wrapped socket with this connection (closed with it, cut by stop())."""
        with self._lock:
            self._live[threading.current_thread()].append(sock)
        return sock

    def _refuse(self, protocol: str, host: str, port: int, refusal: Refusal) -> None:
        self._record(protocol, Verdict("deny", WITHHELD if refusal.withhold_host else host,
                                       port, refusal.reason, refusal.message, refusal.rule))

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



_RESPONSE_CHUNK = 64 * 1024


def _name(host: str) -> str:
    """The normalised host (as the gate and the rules see it), "" if it is not valid."""
    try:
        return target_host(host)
    except ValueError:
        return ""


def _refused(refusal: Refusal) -> bytes:
    return http.response(refusal.status, f"stockade proxy: denied ({refusal.reason}): "
                                         f"{refusal.message}\n")


def _system_tls() -> ssl.SSLContext:
    from stockade.net.authority import upstream_context

    return upstream_context()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
