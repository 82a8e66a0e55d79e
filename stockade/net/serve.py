"""`stockade proxy`: the egress proxy alone, in the foreground, for inspection.

It listens on a fresh unix socket (printed) or on a loopback TCP address (`--listen`), writes
every decision as a JSON line to stdout or `--log`, and stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import threading

from stockade.errors import UsageError
from stockade.net.proxy import Proxy


def serve(allow: list[str], deny: list[str], *, listen: str | None, log: str | None) -> int:
    """Run until interrupted; returns the exit status."""
    proxy = Proxy(allow, deny, "stockade-proxy", log_path=log or "/dev/stdout", log_all=True)
    listener = _loopback_listener(listen) if listen else None
    # (before it serves: a SIGTERM that comes once the first request is answered must stop it)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    where = proxy.start(listener)
    if listener is not None:
        host, port = listener.getsockname()[:2]
        where = f"{host}:{port}"
    print(f"stockade: proxy on {where} (HTTP CONNECT, plain HTTP, SOCKS5); Ctrl-C stops it",
          file=sys.stderr)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


def _loopback_listener(address: str) -> socket.socket:
    """A listener on HOST:PORT, which must be a loopback address: this is for inspection, not
    a service for the network."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback and sep and 0 < int(port) < 65536
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(f"--listen {address}: expected a loopback HOST:PORT such as "
                         "127.0.0.1:3128")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(128)
    return sock
