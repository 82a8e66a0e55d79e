"""The proxy end to end: real clients on its unix socket, real upstream servers on loopback.

Every upstream is started here on an ephemeral loopback port; names resolve only through the
proxy's resolver hook (a dict), so no test touches the system resolver or the outside world.
"""

from __future__ import annotations

import http.server
import json
import os
import queue
import resource
import socket
import socketserver
import stat
import struct
import sys
import threading
import time

import pytest
from conftest import unavailable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.net import relay as relay_module
from stockade.net.proxy import Proxy, ProxyLimits

FAST = ProxyLimits(handshake_timeout=2.0, connect_timeout=2.0, idle_timeout=5.0)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.accepted += 1  # type: ignore[attr-defined]
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    accepted = 0


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Recorder(http.server.BaseHTTPRequestHandler):
    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append((self.requestline, dict(self.headers),  # type: ignore[attr-defined]
                                 self.rfile.read(length)))
        body = b"hello from upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args: object) -> None:
        pass


def _serve(server):
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return server


@pytest.fixture
def echo():
    server = _serve(_Server(("127.0.0.1", 0), _Echo))
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def web():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    server.seen = []
    _serve(server)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def make_proxy(tmp_path):
    proxies = []

    def make(allow=(), deny=(), names=None, limits=FAST, **options):
        def resolver(host):
            return (names or {})[host]
        proxy = Proxy(allow, deny, "req-1", log_path=tmp_path / "network.jsonl",
                      resolver=resolver, limits=limits, **options)
        proxy.start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.stop()


# The C relay (stockade/linux/relay.c) is built on Linux only; elsewhere the Python relay is
# the only one there is.
RELAYS = ["compiled", "python"] if sys.platform.startswith("linux") else ["python"]


@pytest.fixture(params=RELAYS)
def relay(request, monkeypatch) -> str:
    """Which relay carries the tunnels: the C one or the Python one it stands in for where it
    is not built. Both must keep the same rules."""
    if request.param == "python":
        monkeypatch.setattr(relay_module, "compiled_relay", lambda: None)
    elif relay_module.compiled_relay() is None:
        pytest.fail("the C relay (stockade/linux/librelay.so) is not built: "
                    "install Stockade with a C compiler present (setup.py)")
    return request.param


def client(proxy: Proxy) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(proxy.socket_path)
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def http_exchange(proxy: Proxy, request: bytes) -> tuple[int, bytes]:
    with client(proxy) as sock:
        sock.sendall(request)
        response = read_all(sock)
    return int(response.split(b" ", 2)[1]), response


def assert_echoes(sock: socket.socket) -> None:
    sock.sendall(b"ping")
    assert read_exact(sock, 4) == b"ping"


def logged(tmp_path) -> list[dict]:
    text = (tmp_path / "network.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


# HTTP CONNECT


def test_connect_to_a_listed_literal_reaches_the_server(make_proxy, echo, tmp_path):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    with client(proxy) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\nearly".encode())
        assert read_head(sock).startswith(b"HTTP/1.1 200 ")
        assert read_exact(sock, 5) == b"early"
        assert_echoes(sock)
    assert proxy.denials() == [] and logged(tmp_path) == []


def test_connect_to_an_unlisted_domain_is_403_and_logged(make_proxy, tmp_path):
    proxy = make_proxy(["example.com"])
    status, response = http_exchange(proxy, b"CONNECT unlisted.example:443 HTTP/1.1\r\n\r\n")
    assert status == 403
    assert b"unlisted.example:443" in response and b"not_allowed" in response
    assert b"not in network.allow" in response
    [denial] = proxy.denials()
    assert denial | {"time": None} == {
        "time": None, "request_id": "req-1", "protocol": "connect", "host": "unlisted.example",
        "port": 443, "decision": "deny", "rule": None, "reason": "not_allowed",
        "message": "not in network.allow"}
    assert denial["time"].endswith("Z")
    assert logged(tmp_path) == [denial]


def test_dns_rebinding_to_loopback_is_refused(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"rebind.test:{port}"], names={"rebind.test": ["127.0.0.1"]})
    status, response = http_exchange(proxy, f"CONNECT rebind.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert status == 403 and b"rebind.test" in response and b"loopback" in response
    [denial] = proxy.denials()
    assert (denial["reason"], denial["address"]) == ("address_loopback", "127.0.0.1")
    assert echo.accepted == 0


def test_a_name_reaches_loopback_when_the_address_is_listed_too(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"svc.test:{port}", f"127.0.0.1:{port}"],
                       names={"svc.test": ["127.0.0.1"]})
    with client(proxy) as sock:
        sock.sendall(f"CONNECT svc.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert read_head(sock).startswith(b"HTTP/1.1 200 ")
        assert_echoes(sock)


def test_metadata_addresses_are_refused(make_proxy):
    proxy = make_proxy(["meta.test"], names={"meta.test": ["169.254.169.254"]})
    status, response = http_exchange(proxy, b"CONNECT meta.test:80 HTTP/1.1\r\n\r\n")
    assert status == 403 and b"metadata" in response
    status, _ = http_exchange(proxy, b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n")
    assert status == 403
    assert [d["reason"] for d in proxy.denials()] == ["address_metadata", "not_allowed"]


def test_a_failed_dial_is_502(make_proxy):
    port = _closed_port()
    proxy = make_proxy([f"127.0.0.1:{port}"], log_all=True)
    status, response = http_exchange(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    assert status == 502 and b"connection_refused" in response
    assert proxy.denials() == []


# SOCKS5


def socks_request(sock: socket.socket, kind: int, address: bytes, port: int,
                  command: int = 1) -> int:
    sock.sendall(b"\x05\x01\x00")
    assert read_exact(sock, 2) == b"\x05\x00"
    sock.sendall(bytes((5, command, 0, kind)) + address + struct.pack(">H", port))
    reply = read_exact(sock, 10)
    assert reply[:1] == b"\x05"
    return reply[1]


def domain(name: str) -> bytes:
    return bytes((len(name),)) + name.encode()


def test_socks5_domain_allowed(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"echo.test:{port}", f"127.0.0.1:{port}"],
                       names={"echo.test": ["127.0.0.1"]})
    with client(proxy) as sock:
        assert socks_request(sock, 3, domain("echo.test"), port) == 0
        assert_echoes(sock)


def test_socks5_domain_denied(make_proxy):
    proxy = make_proxy(["echo.test"])
    with client(proxy) as sock:
        assert socks_request(sock, 3, domain("denied.test"), 443) == 0x02
        assert read_all(sock) == b""
    [denial] = proxy.denials()
    assert (denial["protocol"], denial["host"], denial["reason"]) == (
        "socks5", "denied.test", "not_allowed")


@pytest.mark.parametrize("command", [2, 3])
def test_socks5_bind_and_udp_are_not_supported(make_proxy, command):
    proxy = make_proxy(["127.0.0.1:53"])
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((127, 0, 0, 1)), 53, command) == 0x07
    assert proxy.denials()[0]["reason"] == "command_not_supported"


def test_socks5_ipv4_literal(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((127, 0, 0, 1)), port) == 0
        assert_echoes(sock)
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((169, 254, 169, 254)), 80) == 0x02


def test_socks5_ipv6_literal(make_proxy):
    try:
        server = _serve(_Server6(("::1", 0), _Echo))
    except OSError:
        unavailable("no IPv6 loopback here")
    try:
        port = server.server_address[1]
        proxy = make_proxy([f"[::1]:{port}"])
        loopback6 = socket.inet_pton(socket.AF_INET6, "::1")
        with client(proxy) as sock:
            assert socks_request(sock, 4, loopback6, port) == 0
            assert_echoes(sock)
        with client(proxy) as sock:
            assert socks_request(sock, 4, loopback6, port + 1 if port < 65535 else 1) == 0x02
    finally:
        server.shutdown()
        server.server_close()


def test_socks5_connection_refused_and_bad_requests(make_proxy):
    port = _closed_port()
    proxy = make_proxy([f"127.0.0.1:{port}"])
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((127, 0, 0, 1)), port) == 0x05
    with client(proxy) as sock:
        assert socks_request(sock, 9, b"", 80) == 0x08
    with client(proxy) as sock:
        sock.sendall(b"\x05\x01\x02")  # username/password only
        assert read_all(sock) == b"\x05\xff"


# Plain HTTP


def test_plain_http_is_forwarded_in_origin_form(make_proxy, web):
    port = web.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    status, response = http_exchange(proxy, (
        f"POST http://127.0.0.1:{port}/path/x?q=1 HTTP/1.1\r\nHost: evil.example\r\n"
        "Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n"
        "Proxy-Authorization: secret\r\nX-Keep: 2\r\nContent-Length: 4\r\n\r\nbody").encode())
    assert status == 200 and response.endswith(b"hello from upstream")
    [(line, headers, body)] = web.seen
    assert line == "POST /path/x?q=1 HTTP/1.1" and body == b"body"
    assert headers == {"Host": f"127.0.0.1:{port}", "X-Keep": "2", "Content-Length": "4",
                       "Connection": "close"}


def test_plain_http_denied_is_403(make_proxy, web):
    proxy = make_proxy([f"127.0.0.1:{web.server_address[1]}"])
    status, response = http_exchange(
        proxy, b"GET http://denied.example/ HTTP/1.1\r\nHost: denied.example\r\n\r\n")
    assert status == 403 and b"denied.example:80" in response and b"not_allowed" in response
    assert proxy.denials()[0]["protocol"] == "http" and web.seen == []


@pytest.mark.parametrize("request_line", [
    b"GET /path HTTP/1.1", b"GET https://127.0.0.1/ HTTP/1.1", b"GET http://u@127.0.0.1/ HTTP/1.1",
    b"CONNECT 127.0.0.1 HTTP/1.1", b"GET  http://127.0.0.1/ HTTP/1.1", b"BREW http://x/ HTCPCP/1.0",
])
def test_requests_not_in_proxy_form_are_400(make_proxy, request_line):
    proxy = make_proxy(["127.0.0.1"])
    status, _ = http_exchange(proxy, request_line + b"\r\n\r\n")
    assert status == 400


def test_oversized_headers_are_431_and_closed(make_proxy):
    limits = ProxyLimits(max_header_bytes=1024, handshake_timeout=2.0)
    proxy = make_proxy(["example.com"], limits=limits)
    with client(proxy) as sock:
        sock.sendall(b"GET http://example.com/ HTTP/1.1\r\nX-Big: " + b"a" * 2000)
        response = read_all(sock)
    assert response.startswith(b"HTTP/1.1 431 ")


# Bounds and lifecycle


def test_a_silent_or_trickling_client_is_dropped_after_the_handshake_timeout(make_proxy):
    proxy = make_proxy(limits=ProxyLimits(handshake_timeout=0.3))
    with client(proxy) as trickle:
        start = time.monotonic()
        with pytest.raises(OSError):
            for byte in b"GET http://example.com/ HTTP/1.1\r\n" * 10:
                trickle.send(bytes((byte,)))
                time.sleep(0.05)
        assert time.monotonic() - start < 5  # (bounded: the trickle alone would take 17 s)
    with client(proxy) as silent:
        start = time.monotonic()
        assert silent.recv(1) == b""
        assert 0.2 < time.monotonic() - start < 5  # (a bound, generous under load)


def test_connections_past_the_limit_are_closed_at_once(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"],
                       limits=ProxyLimits(max_connections=3, handshake_timeout=5.0))
    idle = [client(proxy) for _ in range(3)]
    extra = [client(proxy) for _ in range(20)]
    for sock in extra:
        assert sock.recv(1) == b""
        sock.close()
    idle.pop().close()
    deadline = time.monotonic() + 2
    while True:  # until the proxy has noticed the close; until then it resets newcomers
        with client(proxy) as sock:
            try:
                sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
                if sock.recv(12) == b"HTTP/1.1 200":
                    break
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed at once, before or after our request arrived
        assert time.monotonic() < deadline, "a freed slot was never reused"
        time.sleep(0.05)
    for sock in idle:
        sock.close()


def test_one_proxy_cannot_take_the_descriptors_every_proxy_of_its_process_shares(
        make_proxy, echo, monkeypatch):
    """F11: the daemon holds every warm session's proxy. One sandbox holding connections open
    gets at most its share of the process's descriptor budget; the rest are refused, recorded
    as `connection_limit` denials, and another session's proxy still serves."""
    from stockade.net import proxy as proxy_module

    monkeypatch.setattr(proxy_module._Descriptors, "capacity", staticmethod(lambda: 40))
    port = echo.server_address[1]
    hog = make_proxy([f"127.0.0.1:{port}"], limits=ProxyLimits(handshake_timeout=30.0))
    other = make_proxy([f"127.0.0.1:{port}"])
    held = [_connect_when_accepted(hog) for _ in range(30)]
    try:
        deadline = time.monotonic() + 5
        while sum(not _closed_by_peer(sock) for sock in held) > 10:
            assert time.monotonic() < deadline, "one proxy holds more than its share"
            time.sleep(0.05)
        with client(other) as sock:
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert read_head(sock).startswith(b"HTTP/1.1 200")
            assert_echoes(sock)
        reasons = [entry["reason"] for entry in hog.denials()]
        assert reasons and set(reasons) == {"connection_limit"}
    finally:
        for sock in held:
            sock.close()


def test_the_connection_budget_follows_the_descriptor_limit():
    from stockade.net.proxy import RESERVED_DESCRIPTORS, _Descriptors

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert _Descriptors.capacity() == max(4, (soft - RESERVED_DESCRIPTORS) // 2)


@pytest.fixture
def many_descriptors():
    """Raise this process's soft descriptor limit for a test that holds thousands of sockets
    (both ends: the clients and the proxy's accepted connections live here)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 6000
    if hard != resource.RLIM_INFINITY and hard < want:
        unavailable(f"the hard descriptor limit is {hard}, under {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thousands_of_idle_connections_neither_crash_it_nor_get_through(make_proxy, echo,
                                                                       many_descriptors):
    """3000 clients connect and say nothing: the proxy holds at most `max_connections` of them
    (the rest are closed at once; none of them times out within this test), a denied request
    made meanwhile gets nowhere, and once they leave it serves an allowed request again."""
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"],
                       limits=ProxyLimits(max_connections=256, handshake_timeout=60.0))
    silent = [_connect_when_accepted(proxy) for _ in range(3000)]
    try:
        deadline = time.monotonic() + 5
        while (held := sum(not _closed_by_peer(sock) for sock in silent)) > 256:
            assert time.monotonic() < deadline, f"{held} connections held, limit 256"
            time.sleep(0.05)
        denied = f"CONNECT 127.0.0.1:{_closed_port()} HTTP/1.1\r\n\r\n".encode()
        with client(proxy) as sock:
            try:
                sock.sendall(denied)
                answer = read_all(sock)
            except (ConnectionResetError, BrokenPipeError):
                answer = b""  # closed unanswered: all slots are held
        assert answer == b"" or answer.startswith(b"HTTP/1.1 403"), answer
        assert echo.accepted == 0
    finally:
        for sock in silent:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the proxy frees their slots as it sees them go
        with client(proxy) as sock:
            try:
                sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
                if read_head(sock).startswith(b"HTTP/1.1 200"):
                    assert_echoes(sock)
                    break
            except (AssertionError, ConnectionResetError, BrokenPipeError):
                pass  # closed at once: still full
        assert time.monotonic() < deadline, "the proxy never served again"
        time.sleep(0.1)


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _connect_when_accepted(proxy: Proxy) -> socket.socket:
    """A client, retried while the listener's backlog is full (a unix socket's connect says
    EAGAIN then, rather than waiting)."""
    deadline = time.monotonic() + 10
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect(proxy.socket_path)
            return sock
        except BlockingIOError:
            sock.close()
            assert time.monotonic() < deadline, "the proxy stopped accepting"
            time.sleep(0.001)


def test_an_idle_tunnel_is_closed(make_proxy, echo, relay):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"], limits=ProxyLimits(idle_timeout=0.3))
    with client(proxy) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        read_head(sock)
        assert_echoes(sock)
        start = time.monotonic()
        assert sock.recv(1) == b""
        assert 0.2 < time.monotonic() - start < 5  # (a bound, generous under load)


def tunnel(proxy: Proxy, port: int) -> socket.socket:
    sock = client(proxy)
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    assert read_head(sock).startswith(b"HTTP/1.1 200 ")
    return sock


def upstream(handle) -> _Server:
    """A server on loopback whose connections `handle(server, sock)` serves."""
    handler = type("Handler", (socketserver.BaseRequestHandler,),
                   {"handle": lambda self: handle(self.server, self.request)})
    return _serve(_Server(("127.0.0.1", 0), handler))


def test_a_long_one_way_transfer_is_not_idle(make_proxy, relay):
    def drip(server, sock):  # traffic one way only, for longer than the idle timeout
        for _ in range(10):
            sock.sendall(b"x" * 1000)
            time.sleep(0.1)
    server = upstream(drip)
    port = server.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"], limits=ProxyLimits(idle_timeout=0.4))
    try:
        with tunnel(proxy, port) as sock:
            assert read_all(sock) == b"x" * 10_000
    finally:
        server.shutdown()
        server.server_close()


def test_half_closes_are_passed_on_both_ways(make_proxy, relay):
    heard: queue.Queue[bytes] = queue.Queue()

    def speak_then_listen(server, sock):
        sock.sendall(b"ready")
        sock.shutdown(socket.SHUT_WR)
        heard.put(read_all(sock))
    server = upstream(speak_then_listen)
    port = server.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    try:
        with tunnel(proxy, port) as sock:
            assert read_all(sock) == b"ready"  # upstream's EOF reached the client...
            sock.sendall(b"after your EOF")  # ...and the other way still carries data
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b""
        assert heard.get(timeout=5) == b"after your EOF"
    finally:
        server.shutdown()
        server.server_close()


def test_a_client_half_close_still_gets_the_whole_reply(make_proxy, echo, relay):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    data = os.urandom(3 << 20)  # past the relay's first buffer, so it grows mid-transfer
    with tunnel(proxy, port) as sock:
        reply: list[bytes] = []
        reader = threading.Thread(target=lambda: reply.append(read_all(sock)))
        reader.start()
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reader.join(10)
    assert reply == [data]


def test_concurrent_tunnels_each_carry_their_own_bytes(make_proxy, echo, relay):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    sent = [os.urandom(1 << 20) for _ in range(12)]
    got: dict[int, bytes] = {}

    def exchange(index: int) -> None:
        with tunnel(proxy, port) as sock:
            reader = threading.Thread(target=lambda: got.__setitem__(index, read_all(sock)))
            reader.start()
            sock.sendall(sent[index])
            sock.shutdown(socket.SHUT_WR)
            reader.join(20)
    workers = [threading.Thread(target=exchange, args=(i,)) for i in range(len(sent))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert [got.get(i) == data for i, data in enumerate(sent)] == [True] * len(sent)


def test_a_peer_that_stops_reading_is_cut_after_the_idle_timeout(make_proxy, relay):
    release = threading.Event()

    def never_read(server, sock):  # but keep talking, so the tunnel as a whole is not idle
        while not release.wait(0.05):
            sock.sendall(b".")
    server = upstream(never_read)
    port = server.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"], limits=ProxyLimits(idle_timeout=0.3))
    try:
        with tunnel(proxy, port) as sock:
            sock.settimeout(0.1)
            deadline = time.monotonic() + 3
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                while time.monotonic() < deadline:  # fill every buffer on the way, then stall
                    try:
                        sock.sendall(bytes(1 << 16))
                    except TimeoutError:
                        pass
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_reset_on_one_side_closes_the_other_at_once(make_proxy, relay):
    def reset(server, sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    server = upstream(reset)
    port = server.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])  # idle timeout: 5 s
    try:
        with tunnel(proxy, port) as sock:
            start = time.monotonic()
            assert sock.recv(1) == b""
            assert time.monotonic() - start < 4  # before the 5 s idle timeout: the reset
    finally:
        server.shutdown()
        server.server_close()


def _proxy_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate()
            if thread.name in ("stockade-proxy-connection", "stockade-proxy-relay")]


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_ended_tunnels_leave_no_thread_or_descriptor_behind(make_proxy, echo, relay):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"], limits=ProxyLimits(idle_timeout=0.3))
    before = _open_descriptors()
    with tunnel(proxy, port) as closed_by_client:
        assert_echoes(closed_by_client)
    with tunnel(proxy, port) as half_closed:
        half_closed.shutdown(socket.SHUT_WR)
        assert half_closed.recv(1) == b""
    with tunnel(proxy, port) as idle:
        assert idle.recv(1) == b""
    deadline = time.monotonic() + 3
    while _proxy_threads() or _open_descriptors() > before:
        assert time.monotonic() < deadline, (_proxy_threads(), _open_descriptors(), before)
        time.sleep(0.05)
    live = tunnel(proxy, port)
    # The C relay works in the connection's thread; the Python one adds one for the way back.
    while len(_proxy_threads()) < (1 if relay == "compiled" else 2):
        assert time.monotonic() < deadline + 3, _proxy_threads()
        time.sleep(0.01)
    proxy.stop()
    assert _proxy_threads() == []
    live.close()


def test_socket_is_private_and_stop_cuts_tunnels_and_removes_it(make_proxy, echo, relay):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    path = proxy.socket_path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with client(proxy) as sock:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
        read_head(sock)
        proxy.stop()
        assert sock.recv(1) == b""
    assert not os.path.exists(os.path.dirname(path))
    proxy.stop()


def test_log_all_records_allowed_decisions(make_proxy, echo, tmp_path):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"], log_all=True)
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((127, 0, 0, 1)), port) == 0
    [entry] = logged(tmp_path)
    assert (entry["decision"], entry["rule"], entry["protocol"]) == (
        "allow", f"127.0.0.1:{port}", "socks5")
    assert proxy.denials() == []


HOSTILE = [
    b"\x05", b"\x05\x00", b"\x05\x01\x00\x05\x01\x00\x03", b"\x05\x01\x00\x05\x01\x00\x03\x00",
    b"\x05\x01\x00\x04\x01\x00\x01", b"\x05\xff" + bytes(range(255)),
    b"\x00" * 100 + b"\r\n\r\n", b"GET\r\n\r\n", b"CONNECT :443 HTTP/1.1\r\n\r\n",
    b"CONNECT [::1 HTTP/1.1\r\n\r\n", b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1:0 HTTP/1.1\r\n\r\n", b"GET http://[::1]x/ HTTP/1.1\r\n\r\n",
    b"GET http://a\xff.com/ HTTP/1.1\r\n\r\n", b"GET http://x/ HTTP/1.1\r\n folded\r\n\r\n",
    b"GET http://x/ HTTP/1.1\r\nA\nB: c\r\n\r\n", b"\r\n\r\n", b"\xff" * 50,
]


def _harmless(response: bytes) -> bool:
    if response[:1] == b"\x05":
        return response in (b"\x05\xff", b"\x05\x00") or response[3:4] != b"\x00"
    return response == b"" or response[9:10] in (b"4", b"5")


def test_hostile_input_is_refused_and_the_proxy_keeps_serving(make_proxy, echo):
    port = echo.server_address[1]
    proxy = make_proxy([f"127.0.0.1:{port}"])
    for data in HOSTILE:
        with client(proxy) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            assert _harmless(read_all(sock)), data
    assert echo.accepted == 0
    with client(proxy) as sock:
        assert socks_request(sock, 1, bytes((127, 0, 0, 1)), port) == 0


@pytest.fixture(scope="module")
def closed_proxy():
    with Proxy([], resolver=lambda host: [], limits=FAST) as proxy:
        yield proxy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=300),
    st.builds(lambda head, rest: head + rest,
              st.sampled_from([b"\x05\x01\x00\x05\x01\x00", b"CONNECT ", b"GET http://"]),
              st.binary(max_size=200)),
))
def test_fuzzed_input_never_gets_through(closed_proxy, data):
    with client(closed_proxy) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        assert _harmless(read_all(sock))


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
