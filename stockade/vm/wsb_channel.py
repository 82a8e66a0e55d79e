"""The host's end of a session over a TCP socket: stockade/session/channel.py's framing (whose
`Channel` polls pipes, and Windows cannot poll pipes) on a socket that `select` can watch on
every platform."""

from __future__ import annotations

import select
import socket

from stockade.session.channel import READ_SIZE, FramedChannel


class SocketChannel(FramedChannel):
    """Over a socket, which `select` can watch on every platform."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        sock.setblocking(False)
        self._sock = sock

    def close(self) -> None:
        self._sock.close()

    def _wait(self, seconds: float, sending: bool) -> tuple[bool, bool]:
        readable, writable, _ = select.select([self._sock], [self._sock] if sending else [], [],
                                              seconds)
        return bool(readable), bool(writable)

    def _write(self, data: bytearray) -> int:
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0
        except OSError:
            return len(data)

    def _read_some(self) -> bytes | None:
        try:
            return self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            return b""  # reset: the same as an end, which reading reports
