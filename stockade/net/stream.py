"""Reading a client's handshake against one overall deadline.

A per-read timeout would let a client that trickles one byte at a time hold a connection
forever; here every read gets only what is left of the handshake's budget.
"""

from __future__ import annotations

import socket
import time


class Closed(ConnectionError):
    """The client closed or ran out of time mid-request, or the proxy is stopping."""


class TooLarge(Exception):
    """The client's request head is longer than allowed."""


class Stream:
    """Buffered reads from `sock` that all end by `deadline` (a `time.monotonic()` value)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = bytearray()

    def _fill(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Closed("handshake timed out")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            raise Closed("handshake timed out") from None
        if not data:
            raise Closed("client closed")
        self.buffer += data

    def read(self, size: int) -> bytes:
        """Exactly `size` bytes."""
        while len(self.buffer) < size:
            self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def peek(self) -> int:
        """The next byte, left in the buffer."""
        if not self.buffer:
            self._fill()
        return self.buffer[0]

    def read_head(self, limit: int) -> bytes:
        """Bytes up to and including the first blank line (CRLF CRLF), at most `limit` of them."""
        start = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n", start)
            if end >= 0:
                if end + 4 > limit:
                    raise TooLarge
                return self.read(end + 4)
            if len(self.buffer) >= limit:
                raise TooLarge
            start = max(0, len(self.buffer) - 3)
            self._fill()

    def rest(self) -> bytes:
        """What the client sent beyond its request, to be passed on upstream."""
        data = bytes(self.buffer)
        self.buffer.clear()
        return data

    # A request's body is read after its head, each read within `timeout` of the last: a long
    # upload is not a slow handshake.

    def read_some(self, size: int, timeout: float) -> bytes:
        """Between 1 and `size` bytes."""
        if not self.buffer:
            self.deadline = time.monotonic() + timeout
            self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def read_exactly(self, size: int, timeout: float) -> bytes:
        data = b""
        while len(data) < size:
            data += self.read_some(size - len(data), timeout)
        return data

    def read_line(self, limit: int, timeout: float) -> bytes:
        """Bytes up to and including the next CRLF, at most `limit`; TooLarge past it."""
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) >= limit:
                raise TooLarge
            self.deadline = time.monotonic() + timeout
            self._fill()
        if end + 2 > limit:
            raise TooLarge
        return self.read(end + 2)
