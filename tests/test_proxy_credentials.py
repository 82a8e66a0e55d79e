"""The proxy's reading of requests (network.credentials, network.http): real clients on its
socket, a real HTTPS server on loopback under a test CA of the test's own, names resolved
only by the proxy's resolver hook."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator

import pytest
from tlsworld import Canned, Server, chunked, make_ca, read_head

from stockade.net.authority import LEAVES, Authority, upstream_context
from stockade.net.inspect import Injection, Inspector
from stockade.net.proxy import Proxy, ProxyLimits
from stockade.policy.model import HttpRule

FAST = ProxyLimits(handshake_timeout=3.0, connect_timeout=3.0, idle_timeout=5.0)
SECRET = "s3cret-VALUE-0123456789"
PLACEHOLDER = "stockade-cred-gh-00112233445566778899aabbccddeeff"
NAMES = {"api.test": "127.0.0.1", "other.test": "127.0.0.1"}


@pytest.fixture(scope="module")
def pki() -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as directory:
        yield make_ca(directory, ["api.test", "other.test", "127.0.0.1"])


class Setup:
    def __init__(self, proxy: Proxy, authority: Authority, log: str) -> None:
        self.proxy, self.authority, self.log = proxy, authority, log
        assert proxy.socket_path is not None
        self.path = proxy.socket_path

    def logged(self) -> list[dict]:
        with open(self.log) as handle:
            return [json.loads(line) for line in handle]

    def https(self, host: str, port: int, raw: bytes) -> bytes:
        """CONNECT, TLS trusting the launch's CA, `raw` sent, everything read back."""
        sock = self._connect()
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cadata=self.authority.pem)
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(raw)
            return _all(tls)

    def plain(self, raw: bytes) -> bytes:
        with self._connect() as sock:
            sock.sendall(raw)
            return _all(sock)

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(self.path)
        return sock


def _all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ssl.SSLError, ConnectionResetError):
        pass
    return data


@pytest.fixture
def setup(pki: tuple[str, str], tls_server: Server, plain_server: Server,
          tmp_path) -> Iterator[Setup]:
    ports = (tls_server.port, plain_server.port)
    allow = [f"{name}:{port}" for name in ("api.test", "other.test", "127.0.0.1")
             for port in ports]
    inspector = Inspector(
        [Injection("gh", "api.test", PLACEHOLDER, SECRET, header="Authorization",
                   prefix="Bearer ")],
        [HttpRule("api.test", ("GET", "HEAD"), ("/repos/org/",)),
         HttpRule("other.test", ("GET",), ("/ok/",))])
    authority = Authority("test")
    log = str(tmp_path / "decisions.jsonl")
    proxy = Proxy(allow, (), "req", log_path=log, limits=FAST, resolver=lambda h: [NAMES[h]],
                  inspector=inspector, authority=authority,
                  upstream_tls=upstream_context(pki[0]))
    proxy.start()
    try:
        yield Setup(proxy, authority, log)
    finally:
        proxy.stop()


def get(path: str, host: str, *extra: str, method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *extra, "", ""]
    return "\r\n".join(lines).encode()


def test_the_server_receives_the_secret_in_place_of_the_placeholder(setup, tls_server):
    reply = setup.https("api.test", tls_server.port, get(
        "/repos/org/x", "api.test", f"Authorization: token {PLACEHOLDER}"))
    assert reply.startswith(b"HTTP/1.1 200"), reply
    (seen,) = tls_server.seen
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert PLACEHOLDER not in str(seen.headers)


def test_the_header_is_set_even_when_the_client_sends_none(setup, tls_server):
    setup.https("api.test", tls_server.port, get("/repos/org/y", "api.test"))
    assert tls_server.seen[0].headers["Authorization"] == f"Bearer {SECRET}"


def test_the_secret_is_never_in_the_log_or_a_reply(setup, tls_server):
    replies = [setup.https("api.test", tls_server.port, get("/admin", "api.test")),
               setup.https("other.test", tls_server.port, get(
                   "/ok/", "other.test", f"X-Token: {PLACEHOLDER}"))]
    text = open(setup.log).read()
    assert SECRET not in text and all(SECRET.encode() not in r for r in replies)
    assert text  # (the denials above were logged)


@pytest.mark.parametrize(("where", "request_bytes"), [
    ("header", get("/ok/", "other.test", f"Authorization: Bearer {PLACEHOLDER}")),
    ("path", get(f"/ok/?t={PLACEHOLDER}", "other.test")),
    ("case", get("/ok/", "other.test", f"X-T: {PLACEHOLDER.upper()}")),
    ("body", b"POST /ok/ HTTP/1.1\r\nHost: other.test\r\nContent-Length: "
     + str(len(PLACEHOLDER) + 4).encode() + b"\r\n\r\nt=" + PLACEHOLDER.encode() + b"&x"),
])
def test_the_placeholder_to_another_host_is_refused_and_logged(setup, tls_server, where,
                                                               request_bytes):
    """Over intercepted HTTPS to other.test (an HTTP rule names it, so it is read)."""
    if where == "body":  # (POST is not among other.test's methods: allow it here)
        rule, _ = setup.proxy._inspector.limits.pop()
        setup.proxy._inspector.limits.append((rule, HttpRule("other.test")))
    reply = setup.https("other.test", tls_server.port, request_bytes)
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert b"credential_exfiltration" in reply
    assert [s for s in tls_server.seen if PLACEHOLDER.encode() in s.body] == []
    if where != "body":
        assert tls_server.seen == []
    (entry,) = setup.logged()
    assert entry["reason"] == "credential_exfiltration" and entry["host"] == "other.test"


def test_the_placeholder_in_plain_http_to_another_host_is_refused(setup, plain_server):
    port = plain_server.port
    reply = setup.plain(get(f"http://other.test:{port}/ok/", f"other.test:{port}",
                            f"Cookie: a={PLACEHOLDER}"))
    assert reply.startswith(b"HTTP/1.1 403") and plain_server.seen == []
    assert setup.logged()[0]["reason"] == "credential_exfiltration"


def test_a_body_placeholder_split_across_reads_is_found(setup, plain_server):
    port = plain_server.port
    sock = setup._connect()
    half = len(PLACEHOLDER) // 2
    body = b"x" * 70000 + PLACEHOLDER.encode()
    sock.sendall(f"PUT http://127.0.0.1:{port}/up HTTP/1.1\r\nHost: x\r\nContent-Length: "
                 f"{len(body)}\r\n\r\n".encode() + body[:70000 + half])
    time.sleep(0.5)  # (the proxy reads the first half alone)
    sock.sendall(body[70000 + half:])
    assert _all(sock).startswith(b"HTTP/1.1 403")
    assert plain_server.seen == []  # (the server never got a whole request)


@pytest.mark.parametrize("host", [f"{PLACEHOLDER}.other.test", f"{PLACEHOLDER}.api.test"],
                         ids=["other", "own"])
def test_the_placeholder_in_a_host_name_is_refused_before_any_lookup(setup, host):
    looked_up = []
    setup.proxy.gate.resolver = looked_up.append
    sock = setup._connect()
    sock.sendall(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
    assert read_head(sock).startswith(b"HTTP/1.1 403")
    assert looked_up == [] and setup.logged()[0]["reason"] == "credential_exfiltration"


@pytest.mark.parametrize("carried", [SECRET, PLACEHOLDER, SECRET.encode().hex()[:60]],
                         ids=["secret", "placeholder", "hex"])
@pytest.mark.parametrize("protocol", ["connect", "socks5"])
def test_a_host_name_carrying_the_secret_is_logged_withheld(setup, carried, protocol):
    """Issue 34, D3: a command that has the secret puts it in a host name: refused, and the
    record (the network log, Result.network_log, the denial line) names the credential, not
    the host as sent."""
    host = f"{carried}.other.test"
    sock = setup._connect()
    if protocol == "connect":
        sock.sendall(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
        assert read_head(sock).startswith(b"HTTP/1.1 403")
    else:
        sock.sendall(b"\x05\x01\x00")
        assert sock.recv(2) == b"\x05\x00"
        sock.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode()
                     + (443).to_bytes(2, "big"))
        assert sock.recv(10)[1] == 0x02
    (entry,) = setup.logged()
    assert entry["reason"] == "credential_exfiltration" and "'gh'" in entry["message"]
    assert entry["host"] == "(withheld)"
    with open(setup.log) as log:
        assert carried.lower() not in log.read().lower()


def test_the_credential_host_over_plain_http_is_refused(setup, plain_server):
    port = plain_server.port
    reply = setup.plain(get(f"http://api.test:{port}/repos/org/", "api.test"))
    assert reply.startswith(b"HTTP/1.1 403") and b"credential_needs_https" in reply
    assert plain_server.seen == []


@pytest.mark.parametrize(("method", "path", "reason"), [
    ("POST", "/repos/org/x", "method_not_allowed"),
    ("get", "/repos/org/x", "method_not_allowed"),
    ("GET", "/repos/other/x", "path_not_allowed"),
    ("GET", "/repos/org/../other", "path_ambiguous"),
    ("GET", "/repos/org/%2e%2e/other", "path_ambiguous"),
    ("GET", "/repos/org%2fx", "path_ambiguous"),
])
def test_method_and_path_rules_hold_over_https(setup, tls_server, method, path, reason):
    reply = setup.https("api.test", tls_server.port, get(path, "api.test", method=method))
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert tls_server.seen == []
    (entry,) = setup.logged()
    assert entry["reason"] == reason and entry["rule"] == "api.test"
    assert "network.http" in entry["message"]


def test_method_and_path_rules_hold_over_plain_http(setup, plain_server):
    port = plain_server.port
    base = f"http://other.test:{port}"
    assert setup.plain(get(f"{base}/ok/a", "x")).startswith(b"HTTP/1.1 200")
    assert setup.plain(get(f"{base}/no/a", "x")).startswith(b"HTTP/1.1 403")
    assert setup.plain(get(f"{base}/ok/a", "x", method="DELETE")).startswith(b"HTTP/1.1 403")
    assert [(s.method, s.path) for s in plain_server.seen] == [("GET", "/ok/a")]
    assert [e["reason"] for e in setup.logged()] == ["path_not_allowed", "method_not_allowed"]


def test_an_allowed_https_request_passes(setup, tls_server):
    reply = setup.https("api.test", tls_server.port, get("/repos/org/a?x=1", "api.test",
                                                         method="HEAD"))
    assert reply.startswith(b"HTTP/1.1 200")
    assert [(s.method, s.path) for s in tls_server.seen] == [("HEAD", "/repos/org/a?x=1")]


@pytest.mark.parametrize("framing", [
    "Content-Length: 5\r\nTransfer-Encoding: chunked",
    "Content-Length: 5\r\nContent-Length: 6",
    "Transfer-Encoding: gzip, chunked",
], ids=["both", "two-lengths", "gzip"])
def test_ambiguous_framing_is_refused(setup, tls_server, framing):
    reply = setup.https("api.test", tls_server.port, (
        f"GET /repos/org/a HTTP/1.1\r\nHost: api.test\r\n{framing}\r\n\r\n0\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 400"), reply
    assert tls_server.seen == [] and setup.logged()[0]["reason"] == "ambiguous_framing"


def test_a_smuggled_second_request_never_reaches_the_server(setup, tls_server):
    smuggled = get("/repos/org/a", "api.test") + b"DELETE /admin HTTP/1.1\r\nHost: a\r\n\r\n"
    reply = setup.https("api.test", tls_server.port, smuggled)
    assert reply.count(b"HTTP/1.1 ") == 1
    assert [(s.method, s.path) for s in tls_server.seen] == [("GET", "/repos/org/a")]


def test_a_chunked_body_is_passed_exactly(setup, tls_server):
    rule, _ = setup.proxy._inspector.limits.pop(0)
    setup.proxy._inspector.limits.insert(0, (rule, HttpRule("api.test")))
    reply = setup.https("api.test", tls_server.port, (
        b"POST /repos/org/a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert [(s.method, s.body) for s in tls_server.seen] == [("POST", b"abc")]


@pytest.mark.parametrize(("raw", "reason"), [
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "http2_refused"),
    (b"CONNECT inner.test:443 HTTP/1.1\r\nHost: inner.test\r\n\r\n", "connect_in_tunnel"),
], ids=["http2", "connect"])
def test_http2_and_connect_inside_an_intercepted_tunnel_are_refused(setup, tls_server, raw,
                                                                     reason):
    reply = setup.https("api.test", tls_server.port, raw)
    assert reply.startswith(b"HTTP/1.1 "), reply
    assert tls_server.seen == [] and setup.logged()[0]["reason"] == reason


def test_socks5_to_an_inspected_host_is_refused(setup, tls_server):
    sock = setup._connect()
    sock.sendall(b"\x05\x01\x00")
    assert sock.recv(2) == b"\x05\x00"
    name = b"api.test"
    sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name
                 + tls_server.port.to_bytes(2, "big"))
    assert sock.recv(10)[1] == 0x02
    assert setup.logged()[0]["reason"] == "socks_to_inspected_host"


def test_a_host_no_rule_names_stays_a_blind_tunnel(setup, tls_server):
    """127.0.0.1 is allowed but named by no credential or rule: its certificate is the
    server's own (the client must trust the test CA, not the launch's)."""
    sock = setup._connect()
    sock.sendall(f"CONNECT 127.0.0.1:{tls_server.port} HTTP/1.1\r\n\r\n".encode())
    assert read_head(sock).startswith(b"HTTP/1.1 200")
    with pytest.raises(ssl.SSLCertVerificationError):
        ssl.create_default_context(cadata=setup.authority.pem).wrap_socket(
            sock, server_hostname="127.0.0.1")


def test_an_upstream_that_fails_verification_is_not_sent_the_secret(pki, tls_server, tmp_path):
    """The upstream is checked against the system trust store, which does not hold the test
    CA: the request (and its secret) never leaves."""
    inspector = Inspector([Injection("gh", "api.test", PLACEHOLDER, SECRET, header="X-Key")])
    authority = Authority("t")
    proxy = Proxy([f"api.test:{tls_server.port}", f"127.0.0.1:{tls_server.port}"], (), "r",
                  limits=FAST, resolver=lambda h: ["127.0.0.1"], inspector=inspector,
                  authority=authority, log_path=str(tmp_path / "log"), log_all=True)
    proxy.start()
    try:
        reply = Setup(proxy, authority, str(tmp_path / "log")).https(
            "api.test", tls_server.port, get("/", "api.test"))
    finally:
        proxy.stop()
    assert reply.startswith(b"HTTP/1.1 502") and tls_server.seen == []


@pytest.mark.parametrize("mode", ["header", "basic_user", "query"])
def test_a_response_that_echoes_the_secret_is_cut_before_it(pki, tls_server, tmp_path, mode):
    """The secret as it was sent (clear, base64, percent-encoded), past a first piece of the
    response: the client gets what came before, never the secret."""
    place = {"header": {"header": "X-Key"}, "basic_user": {"basic_user": "u"},
             "query": {"query": "key"}}[mode]
    secret = SECRET + "/+="  # (percent-encoded in a query, not in base64's alphabet alone)
    inspector = Inspector([Injection("gh", "api.test", PLACEHOLDER, secret, **place)])
    authority = Authority("t")
    log = str(tmp_path / "log")
    proxy = Proxy([f"api.test:{tls_server.port}", f"127.0.0.1:{tls_server.port}"], (), "r",
                  limits=FAST, resolver=lambda h: ["127.0.0.1"], inspector=inspector,
                  authority=authority, log_path=log, upstream_tls=upstream_context(pki[0]))
    proxy.start()
    try:
        setup = Setup(proxy, authority, log)
        reply = setup.https("api.test", tls_server.port, get(
            "/a/echo?x=1", "api.test", "Accept-Encoding: gzip"))
    finally:
        proxy.stop()
    (seen,) = tls_server.seen
    assert "Accept-Encoding" not in seen.headers
    sent = {"header": secret, "basic_user": "Basic ", "query": "key="}[mode]
    assert sent in str(seen.headers) + seen.path
    assert reply.startswith(b"HTTP/1.1 200") and b"xxxx" in reply
    for form in (secret, urllib.parse.quote(secret, safe=""),
                 base64.b64encode(f"u:{secret}".encode()).decode()):
        assert form.encode() not in reply
    assert setup.logged()[0]["reason"] == "credential_reflected"


def _echo_split(head: bytes) -> bytes:
    """The request head echoed in two chunks, split in the middle of the secret."""
    at = head.index(SECRET.encode()) + len(SECRET) // 2
    return chunked(b"x" * 9000, head[:at], head[at:])


def _dechunk(reply: bytes) -> bytes:
    """What a client library hands the application of a chunked reply."""
    body, out = reply.partition(b"\r\n\r\n")[2], b""
    while body:
        line, _, body = body.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2:]
    return out


@contextlib.contextmanager
def canned(pki: tuple[str, str], tmp_path, reply: Callable[[bytes], bytes],
           injection: Injection | None = None) -> Iterator[tuple[Setup, Canned]]:
    server = Canned(pki[1], reply)
    inspector = Inspector([injection or Injection("gh", "api.test", PLACEHOLDER, SECRET,
                                                  header="Authorization", prefix="Bearer ")])
    authority = Authority("t")
    log = str(tmp_path / "log")
    proxy = Proxy([f"api.test:{server.port}", f"127.0.0.1:{server.port}"], (), "r", limits=FAST,
                  resolver=lambda h: ["127.0.0.1"], inspector=inspector, authority=authority,
                  log_path=log, upstream_tls=upstream_context(pki[0]))
    proxy.start()
    try:
        yield Setup(proxy, authority, log), server
    finally:
        proxy.stop()
        server.sock.close()


def test_a_secret_split_by_the_servers_chunks_is_cut_before_it(pki, tmp_path):
    """C1: the server echoes the request with the secret split between two chunks; the
    client's library joins the chunks, so the check reads the body de-chunked."""
    with canned(pki, tmp_path, _echo_split) as (setup, server):
        reply = setup.https("api.test", server.port, get("/a", "api.test"))
        assert SECRET.encode() in server.heads[0]  # (the secret was sent, and echoed)
        body = _dechunk(reply)
        assert SECRET.encode() not in body and SECRET[:8].encode() not in body
        assert body.startswith(b"x" * 9000)  # (what came before the secret went)
        assert b";e=1" not in reply  # (re-chunked: the server's extensions stay behind)
        assert setup.logged()[0]["reason"] == "credential_reflected"


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/99\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: multipart/byteranges; boundary=b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Encoding:\r\n gzip\r\n\r\n",
], ids=["gzip", "206", "byteranges", "te-gzip", "folded"])
def test_a_response_the_check_cannot_read_decoded_is_refused(pki, tmp_path, head):
    with canned(pki, tmp_path, lambda _: head + b"opaque") as (setup, server):
        reply = setup.https("api.test", server.port, get("/a", "api.test"))
        assert reply.startswith(b"HTTP/1.1 502") and b"opaque" not in reply, reply
        assert setup.logged()[0]["reason"] == "credential_response_unreadable"


def test_a_plain_chunked_response_passes_whole(pki, tmp_path):
    with canned(pki, tmp_path, lambda _: chunked(b"hello ", b"world")) as (setup, server):
        reply = setup.https("api.test", server.port, get("/a", "api.test"))
        assert reply.startswith(b"HTTP/1.1 200") and _dechunk(reply) == b"hello world", reply


@pytest.mark.parametrize("form", [
    SECRET, urllib.parse.quote(SECRET, safe=""), SECRET.encode().hex().upper(),
    base64.b64encode(b"ab" + SECRET.encode()).decode()[4:],
    base64.b64encode(b"a" + SECRET.encode()).decode(),
], ids=["clear", "percent", "hex", "base64-shifted", "base64-other-shift"])
def test_the_secret_itself_to_another_host_is_refused(setup, tls_server, form):
    """The second line: a secret that got out of its host's responses re-encoded (a form the
    response check does not know) still does not reach another host in a request it reads."""
    reply = setup.https("other.test", tls_server.port, get(f"/ok/?t={form}", "other.test"))
    assert reply.startswith(b"HTTP/1.1 403") and b"credential_exfiltration" in reply, reply
    assert tls_server.seen == []
    (entry,) = setup.logged()
    assert entry["reason"] == "credential_exfiltration" and "secret" in entry["message"]
    assert SECRET not in json.dumps(entry)


@pytest.mark.parametrize("path", [
    "/repos/org/..;/admin", "/repos/org/%252e%252e/admin", "/repos/org/%c0%ae%c0%ae/admin",
    "/repos/org/\uff0e\uff0e/admin", "/repos/org/%u002e%u002e/admin", "/repos/org/..%09/admin",
    "/repos/org/..%00/admin", "/repos/org/x\x7f",
], ids=["semicolon", "double-encoded", "overlong", "fullwidth", "u-escape", "tab", "nul", "del"])
def test_a_path_servers_may_read_as_another_is_refused(setup, tls_server, path):
    """P1: under a path rule, forms that Tomcat, IIS, double-decoding or Unicode-normalising
    servers read as a path outside the prefix never reach the server."""
    reply = setup.https("api.test", tls_server.port, get(path, "api.test"))
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert tls_server.seen == [] and setup.logged()[0]["reason"] == "path_ambiguous"


@pytest.mark.parametrize(("body", "reason"), [
    (f"5;leak={PLACEHOLDER}\r\nhello\r\n0\r\n\r\n", "credential_exfiltration"),
    (f"10;x\n{PLACEHOLDER}\r\n0\r\n\r\n{'x' * 11}\r\n0\r\n\r\n", "ambiguous_framing"),
    ("5\r\nhello\r\n0\r\nX: a\nY: b\r\n\r\n", "ambiguous_framing"),
], ids=["extension", "bare-lf-line", "bare-lf-trailer"])
def test_chunk_lines_carry_no_placeholder_nor_a_bare_line_break(setup, plain_server, body,
                                                                reason):
    """X1/X2: a chunk extension is scanned like the body, and a chunk line or trailer with a
    bare LF (which an LF-tolerant server ends the line at, reading the rest as data) is
    refused."""
    port = plain_server.port
    reply = setup.plain((f"POST http://127.0.0.1:{port}/up HTTP/1.1\r\nHost: x\r\n"
                         f"Transfer-Encoding: chunked\r\n\r\n{body}").encode())
    assert reply.startswith(b"HTTP/1.1 4"), reply
    assert setup.logged()[0]["reason"] == reason
    # (what came before the refusal may reach the server, whole at most up to the last chunk)
    assert all(seen.body == b"hello" for seen in plain_server.seen), plain_server.seen


def test_a_placeholder_split_over_two_chunks_is_found(setup, plain_server):
    """The server joins a chunked body's chunks: a placeholder split between two of them is
    one placeholder to it, whatever chunk line lies between the halves on the wire."""
    port = plain_server.port
    half = len(PLACEHOLDER) // 2
    first, second = PLACEHOLDER[:half], PLACEHOLDER[half:]
    reply = setup.plain((f"POST http://127.0.0.1:{port}/up HTTP/1.1\r\nHost: x\r\n"
                         f"Transfer-Encoding: chunked\r\n\r\n{len(first):x}\r\n{first}\r\n"
                         f"{len(second):x};e=1\r\n{second}\r\n0\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 403"), reply
    assert setup.logged()[0]["reason"] == "credential_exfiltration"
    assert all(PLACEHOLDER.encode() not in seen.body for seen in plain_server.seen)


def test_the_leaf_cache_is_bounded():
    """D1: under a wildcard credential host every name the sandbox invents makes a leaf; the
    proxy keeps only the LEAVES used last."""
    authority = Authority("t")
    first = authority.issue("n0.example.com")
    for i in range(1, LEAVES + 5):
        authority.issue(f"n{i}.example.com")
        assert authority.issue("n0.example.com") is first  # (used last: kept)
    assert len(authority._contexts) == LEAVES and "n1.example.com" not in authority._contexts


def _login_redirect(head: bytes) -> bytes:
    """A `302` to the login page with `?next=` the path as received, quoted once more (as
    Django's redirect_to_login and most `?next=` redirects do)."""
    path = head.split(b" ")[1].decode()
    location = "/accounts/login/?next=" + urllib.parse.quote(path, safe="/")
    return (f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n").encode()


def _base64url_echo(head: bytes) -> bytes:
    """The request head echoed base64url-encoded, unpadded (a JWT-style `state`)."""
    token = base64.urlsafe_b64encode(head).rstrip(b"=")
    body = b'{"state": "' + token + b'"}'
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (
        len(body), body)


def _base64url_secret() -> str:
    """A printable secret whose base64, at each of the three alignments, holds "+" or "/"
    (so that its base64url text differs from its base64)."""
    for n in range(1000):
        secret = f"sk_live_{n:04d}~?~?ab>>cd??"
        if all(set(base64.b64encode(b"\0" * shift + secret.encode())[4:-4]) & set(b"+/")
               for shift in range(3)):
            return secret
    raise AssertionError("no such secret")


@pytest.mark.parametrize("form", ["twice-percent-encoded", "base64url"])
def test_a_secret_reflected_encoded_once_more_or_base64url_is_cut(pki, tmp_path, form):
    """Issue 34, R1/R2: the query slot's secret comes back in a login redirect's `?next=`,
    percent-encoded twice (`%2F` as `%252F`; the client decodes twice), or the header slot's
    request head comes back base64url-encoded: each is a form of the secret the check cuts."""
    if form == "base64url":
        secret, reply = _base64url_secret(), _base64url_echo
        injection = Injection("gh", "api.test", PLACEHOLDER, secret, header="X-Key")
    else:
        secret, reply = "wJalrXUtnFEMI/K7MDENG+bPxRfiCY=", _login_redirect
        injection = Injection("gh", "api.test", PLACEHOLDER, secret, query="X-Amz-Credential")
    with canned(pki, tmp_path, reply, injection) as (setup, server):
        answer = setup.https("api.test", server.port, get("/private/report", "api.test"))
        assert secret.encode() in urllib.parse.unquote_to_bytes(server.heads[0])  # (sent)
        assert setup.logged()[0]["reason"] == "credential_reflected"
    twice = urllib.parse.unquote_to_bytes(urllib.parse.unquote(answer.decode("latin-1")))
    token = answer.partition(b'"state": "')[2].partition(b'"')[0]
    decoded = base64.urlsafe_b64decode(token + b"=" * (-len(token) % 4))
    assert secret.encode() not in twice and secret.encode() not in decoded
