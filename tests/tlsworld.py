"""A loopback HTTPS (and HTTP) server under a test CA of the tests' own (made as the evidence
matrix makes its own: stockade/evidence/web.py), which records every request it receives
(method, path, headers, body)."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from stockade.evidence.web import make_ca as make_ca  # (the tests import it from here)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    port: int
    seen: list[Seen] = field(default_factory=list)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding") == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        self.server.record.seen.append(Seen(self.command, self.path, dict(self.headers), body))
        reply = f"seen {self.command} {self.path}".encode()
        if self.path.partition("?")[0].endswith("/echo"):  # (a server that shows what it was sent)
            reply = b"x" * 70000 + (self.path + str(dict(self.headers))).encode()
        target = self.path.partition("?to=")[2]
        self.send_response(302 if target else 200)
        if target:  # (a redirect: where the client goes next is its own choice)
            self.send_header("Location", target)
        self.send_header("Content-Length", str(len(reply)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _any  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


class serving:  # noqa: N801 - used as a context manager, like open()
    """A threaded loopback server (TLS with `certfile`, else plain) for the `with` block."""

    def __init__(self, certfile: str | None = None) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        if certfile is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.record = Server(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self.httpd.record

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class Canned:
    """A loopback HTTPS server whose reply is `reply(request head)`, raw: the framing a test
    needs (chunks that split what the server echoes, compressed bodies, ranges). `heads`
    keeps the request heads it got."""

    def __init__(self, certfile: str, reply: Callable[[bytes], bytes]) -> None:
        self.reply, self.heads = reply, []
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certfile)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    head = read_head(conn)
                    self.heads.append(head)
                    conn.sendall(self.reply(head))
            except (OSError, ssl.SSLError):
                if self.sock.fileno() < 0:
                    return


def chunked(*pieces: bytes, head: bytes = b"") -> bytes:
    """A chunked 200 of `pieces` (each chunk with an extension), `head` added to its head."""
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n" + head
            + b"\r\n" + b"".join(b"%x;e=1\r\n%b\r\n" % (len(p), p) for p in pieces)
            + b"0\r\n\r\n")


def read_head(sock: socket.socket) -> bytes:
    """What `sock` reads up to the end of a head (or of the stream)."""
    data = b""
    while b"\r\n\r\n" not in data and (byte := sock.recv(1)):
        data += byte
    return data
