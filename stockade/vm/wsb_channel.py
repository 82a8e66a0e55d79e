"""The host's end of a session over a TCP socket: the same `send`/`receive`/`close` as
stockade/session/channel.py (which polls pipes, and Windows cannot poll pipes), on a socket
that `select` can watch on every platform. Frames are checked by the same protocol Decoder."""

from __future__ import annotations

import collections
import select
import socket
import time

from stockade.session import protocol
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.protocol import Message

READ_SIZE = 1 << 17
MAX_WAIT = 3600.0  # seconds one select may last (far deadlines are reached in several)


class SocketChannel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._decoder = protocol.Decoder(protocol.TO_HOST)
        self._outbox = bytearray()
        self._inbox: collections.deque[Message] = collections.deque()
        self._ended = False

    def send(self, message: Message) -> None:
        self._outbox += protocol.encode(message)
        self._flush()

    def receive(self, timeout: float | None) -> Message | None:
        """The next message from the agent, or None once `timeout` seconds passed first.
        Raises ProtocolError for a bad frame and SessionError(`session_lost`) when the agent's
        side has closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._inbox:
            if self._ended:
                raise SessionError("session_lost", "the agent ended the session")
            left = MAX_WAIT if deadline is None else min(max(deadline - time.monotonic(), 0),
                                                         MAX_WAIT)
            readable, writable, _ = select.select(
                [self._sock], [self._sock] if self._outbox else [], [], left)
            if writable:
                self._flush()
            if readable:
                self._read()
            if not (readable or writable) and deadline is not None \
                    and time.monotonic() >= deadline:
                return None
        return self._inbox.popleft()

    def close(self) -> None:
        self._sock.close()

    def _flush(self) -> None:
        try:
            sent = self._sock.send(self._outbox) if self._outbox else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(self._outbox)  # the agent is gone; reading says so
        del self._outbox[:sent]

    def _read(self) -> None:
        try:
            chunk = self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""  # reset: the same as an end, which reading reports
        if not chunk:
            self._ended = True
            self._decoder.finish()
            return
        for message in self._decoder.feed(chunk):
            if message.type == "error" and message.command == 0:
                code = message.body["code"]
                raise ProtocolError(code if code in protocol.FATAL_CODES else "internal",
                                    f"the agent ended the session: {message.body['message'][:200]}")
            self._inbox.append(message)
