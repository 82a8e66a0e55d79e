"""HTTP proxy requests: `CONNECT host:port` tunnels and absolute-form plain HTTP.

A plain request is forwarded with its request line in origin form, a `Host` header naming the
checked destination (RFC 9112 §3.2.2: a proxy replaces the client's), hop-by-hop headers and
those named in `Connection` removed, and `Connection: close`: one request per connection, so
every request is decided on its own. The body is passed through verbatim, which is why
`Transfer-Encoding` and `Content-Length` are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus

from stockade.net.stream import Stream, TooLarge

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/1\.[01]")
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "upgrade", "host",
})


class HttpError(Exception):
    """The request cannot be served; `status` is the response to send before closing."""

    def __init__(self, status: int, message: str, reason: str = "malformed_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class Request:
    """A parsed proxy request; `path` and `headers` only matter for plain HTTP."""

    method: str
    host: str
    port: int
    version: str
    path: str = ""
    headers: tuple[tuple[str, str], ...] = ()


def read_request(stream: Stream, limit: int, tunnel: tuple[str, int] | None = None) -> Request:
    """Read and parse a request head of at most `limit` bytes; HttpError if it is unusable.

    With `tunnel` (host, port), the request comes inside an intercepted HTTPS tunnel to that
    destination: origin form only, HTTP/1.x only, no CONNECT (a tunnel in the tunnel would be
    one the proxy cannot read)."""
    try:
        head = stream.read_head(limit).decode("latin-1")
    except TooLarge:
        raise HttpError(431, f"request head over {limit} bytes") from None
    line, *fields = head[:-4].split("\r\n")
    if tunnel is not None and line == "PRI * HTTP/2.0":
        raise HttpError(505, "HTTP/2 inside an intercepted tunnel (only HTTP/1.1 is read)",
                        "http2_refused")
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _VERSION.fullmatch(parts[2]):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    headers = []
    for field in fields:
        name, colon, value = field.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
            raise HttpError(400, "malformed header field")
        headers.append((name, value.strip(" \t")))
    if tunnel is not None:
        if method == "CONNECT":
            raise HttpError(405, "CONNECT inside an intercepted tunnel", "connect_in_tunnel")
        if not target.startswith("/"):
            raise HttpError(400, "a request in a tunnel needs an origin-form target (/path)")
        return Request(method, *tunnel, version, target.partition("#")[0], tuple(headers))
    if method == "CONNECT":
        host, port = _authority(target, None)
        return Request(method, host, port, version)
    if target[:7].lower() != "http://":
        raise HttpError(400, "a proxy request needs an absolute http:// URI "
                             "(use CONNECT for https)")
    rest = target[7:].partition("#")[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    host, port = _authority(rest[:cut], 80)
    path = rest[cut:]
    path = path if path.startswith("/") else "/" + path
    return Request(method, host, port, version, path, tuple(headers))


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    """(host, port) of `host:port` or `[v6]:port`; HttpError if malformed."""
    if text.startswith("["):
        inner, bracket, rest = text[1:].partition("]")
        host, port_text = f"[{inner}]", rest[1:]
        valid = bool(bracket) and (rest == "" or rest.startswith(":"))
    else:
        host, _, port_text = text.partition(":")
        valid = ":" not in port_text and "@" not in text
    if not port_text and default_port is not None:
        port_text = str(default_port)
    if not (valid and host and port_text.isdigit() and len(port_text) <= 5):
        raise HttpError(400, "malformed host:port")
    return host, int(port_text)


def forward_head(request: Request, host: str) -> bytes:
    """The head sent upstream for a plain request to the checked `host`."""
    connection = {token.strip().lower() for name, value in request.headers
                  if name.lower() in ("connection", "proxy-connection")
                  for token in value.split(",")}
    authority = host if request.port == 80 else f"{host}:{request.port}"
    lines = [f"{request.method} {request.path} {request.version}", f"Host: {authority}"]
    lines += [f"{name}: {value}" for name, value in request.headers
              if name.lower() not in _HOP_BY_HOP and name.lower() not in connection]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(status: int, body: str) -> bytes:
    """A complete response that closes the connection."""
    data = body.encode("utf-8")
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode("ascii") + data
