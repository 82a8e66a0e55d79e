"""Allowlist mode: get around Stockade's proxy. `direct:HOST:PORT` ignores the proxy;
`via:HOST:PORT` asks the proxy to CONNECT there (a name that resolves to loopback, an IP literal,
a metadata address). A reply from the target, or the proxy's 200, is an escape."""

import os
import socket
from urllib.parse import urlsplit

from _common import ARGS, CannotTry, Refused, attempt, note


def direct(host, port):
    with socket.create_connection((host, port), timeout=2) as s:
        s.sendall(b"ping")
        return f"reply {s.recv(64)!r}"


def via_proxy(host, port):
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if not proxy:
        raise CannotTry("no proxy in the environment")
    where = urlsplit(proxy)
    with socket.create_connection((where.hostname, where.port), timeout=5) as s:
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        status = s.recv(256).split(b"\r\n", 1)[0]
        note(f"proxy answered CONNECT {host}:{port}", status.decode("latin-1"))
        if b" 200" not in status:
            raise Refused(f"HTTP_{status.split()[1].decode('latin-1')}" if len(status.split()) > 1
                          else "NO_ANSWER", status.decode("latin-1"))
        return status.decode("latin-1")


for target in ARGS:
    mode, host, port = target.split(":")
    action = direct if mode == "direct" else via_proxy
    attempt(f"{mode} {host}:{port}", lambda a=action, h=host, p=int(port): a(h, p))
