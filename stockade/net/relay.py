"""Copy bytes both ways between a client and its upstream until both sides finish.

Where it was built (Linux: stockade/linux/librelay.so, see setup.py), the C relay in
stockade/linux/relay.c does it, in the calling thread, outside the interpreter's lock: an owner
busy in Python code would otherwise hold each chunk back for up to the interpreter's switch
interval (bench/proxy.py measures both with a busy owner). Elsewhere, one Python thread per
direction, each a plain blocking recv_into/sendall loop with a large buffer: the fastest relay
in Python measured with bench/proxy.py (a selector loop with socket timeouts pays a poll() per
call; splice(2), a sockmap, and a reader and a writer thread per direction were no faster:
docs/performance.md). The kernel keeps its bounds (SO_RCVTIMEO, SO_SNDTIMEO), so the loops make
no extra system calls. Both keep the same rules:

- the idle timeout covers the tunnel as a whole: a direction that waits longer than it keeps
  waiting while the other direction has had traffic within the timeout (a long download is
  not idle just because the client says nothing);
- a peer that stops reading stalls a send for at most the idle timeout;
- half-closes are passed on: EOF one way shuts down writing the other way, and the other way
  goes on;
- anything else (an error, the idle timeout, the proxy stopping) shuts both sockets down, which
  ends the other direction too.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

# A direction starts small and grows once a read fills its buffer: bulk transfers get fewer,
# larger system calls; the many quiet tunnels keep little memory.
_FIRST_CHUNK = 64 * 1024
_BULK_CHUNK = 1024 * 1024
_SHORTEST_WAIT = 0.001  # a zero SO_RCVTIMEO / SO_SNDTIMEO would mean "wait forever"


_LIBRARY = os.path.join(os.path.dirname(os.path.dirname(__file__)), "linux", "librelay.so")


@functools.cache
def compiled_relay() -> Callable[[int, int, int], int] | None:
    """stockade_relay(client_fd, upstream_fd, idle_ms) from the C relay; None where it was not
    built (or cannot be loaded here)."""
    try:
        library = ctypes.CDLL(_LIBRARY)  # (CDLL: calls release the interpreter's lock)
    except OSError:
        return None
    function = library.stockade_relay
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
    function.restype = ctypes.c_int
    return function


def relay(client: socket.socket, upstream: socket.socket, idle_timeout: float) -> None:
    """Return when both directions reached EOF, on an error, or after `idle_timeout` seconds
    without traffic. The caller closes the sockets."""
    compiled = compiled_relay()
    if compiled is not None:
        idle_ms = min(max(1, round(idle_timeout * 1000)), 2**31 - 1)  # (a C int)
        compiled(client.fileno(), upstream.fileno(), idle_ms)
        return
    tunnel = _Tunnel(client, upstream, idle_timeout)
    for sock in (client, upstream):
        sock.settimeout(None)  # blocking: the kernel timeouts below bound every wait
        _set_wait(sock, socket.SO_RCVTIMEO, idle_timeout)
        _set_wait(sock, socket.SO_SNDTIMEO, idle_timeout)
    downstream = threading.Thread(target=tunnel.pump, args=(upstream, client),
                                  name="stockade-proxy-relay", daemon=True)
    try:
        downstream.start()
    except RuntimeError:  # no more threads: give this tunnel up
        return
    tunnel.pump(client, upstream)
    downstream.join()


class _Tunnel:
    def __init__(self, client: socket.socket, upstream: socket.socket,
                 idle_timeout: float) -> None:
        self.sockets = (client, upstream)
        self.idle_timeout = idle_timeout
        self.last_traffic = time.monotonic()

    def pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy `source` to `sink` until EOF (passed on as a half-close) or a failure (which
        cuts the whole tunnel)."""
        buffer = memoryview(bytearray(_FIRST_CHUNK))
        try:
            while size := self._receive(source, buffer):
                sink.sendall(buffer[:size])
                if size == len(buffer) < _BULK_CHUNK:
                    buffer = memoryview(bytearray(_BULK_CHUNK))
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # reset, timed out, or cut by the other direction or `Proxy.stop`
            self._cut()

    def _receive(self, source: socket.socket, buffer: memoryview) -> int:
        while True:
            try:
                size = source.recv_into(buffer)
            except BlockingIOError:  # SO_RCVTIMEO passed with nothing read this way
                left = self.last_traffic + self.idle_timeout - time.monotonic()
                if left <= 0:
                    raise
                _set_wait(source, socket.SO_RCVTIMEO, left)
                continue
            self.last_traffic = time.monotonic()
            return size

    def _cut(self) -> None:
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _set_wait(sock: socket.socket, option: int, seconds: float) -> None:
    seconds = max(seconds, _SHORTEST_WAIT)
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, option, timeval)
