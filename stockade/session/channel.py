"""The host's end of a session: checked frames to and from one agent, without threads (the
calling thread waits). `FramedChannel` holds the framing; `Channel` carries it over the agent's
stdin/stdout pipes (polled), stockade/vm/wsb_channel.py over a socket."""

from __future__ import annotations

import abc
import collections
import os
import select
import time
from collections.abc import Callable
from typing import IO

from stockade.session import protocol
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.protocol import Message

READ_SIZE = 1 << 17
MAX_WAIT = 3600.0  # seconds one wait may last (far deadlines are reached in several)


class FramedChannel(abc.ABC):
    def __init__(self) -> None:
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
            readable, writable = self._wait(left, bool(self._outbox))
            if writable:
                self._flush()
            if readable:
                self._read()
            if not (readable or writable) and deadline is not None \
                    and time.monotonic() >= deadline:
                return None
        return self._inbox.popleft()

    @abc.abstractmethod
    def close(self) -> None:
        """Close the transport."""

    @abc.abstractmethod
    def _wait(self, seconds: float, sending: bool) -> tuple[bool, bool]:
        """Wait up to `seconds` until the agent's side is readable (or writable, if
        `sending`); which of the two it became."""

    @abc.abstractmethod
    def _write(self, data: bytearray) -> int:
        """Write what the transport takes now: the count (0 if none; all of it once the agent
        is gone, which reading then reports)."""

    @abc.abstractmethod
    def _read_some(self) -> bytes | None:
        """What the agent sent (b"" at its end), or None if nothing is there after all."""

    def _flush(self) -> None:
        sent = self._write(self._outbox) if self._outbox else 0
        del self._outbox[:sent]

    def _read(self) -> None:
        chunk = self._read_some()
        if chunk is None:
            return
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


class Channel(FramedChannel):
    """Over the agent's stdin and stdout pipes. `status`: the sandbox's own status descriptor
    and its reader (Handle.status_reader), read whenever it has something while the channel
    is waited on: what writes it never waits, and would lose what a full pipe cannot take."""

    def __init__(self, to_agent: IO[bytes], from_agent: IO[bytes],
                 status: tuple[int, Callable[[], bool]] | None = None) -> None:
        super().__init__()
        self._files = (to_agent, from_agent)
        self._w, self._r = to_agent.fileno(), from_agent.fileno()
        self._status = status
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def _wait(self, seconds: float, sending: bool) -> tuple[bool, bool]:
        poller = select.poll()
        poller.register(self._r, select.POLLIN)
        if sending:
            poller.register(self._w, select.POLLOUT)
        if self._status is not None:
            poller.register(self._status[0], select.POLLIN)
        ready = {fd for fd, _ in poller.poll(seconds * 1000)}
        if self._status is not None and self._status[0] in ready and not self._status[1]():
            self._status = None  # (it has ended)
        return self._r in ready, self._w in ready

    def _write(self, data: bytearray) -> int:
        try:
            return os.write(self._w, data)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            return len(data)

    def _read_some(self) -> bytes | None:
        try:
            return os.read(self._r, READ_SIZE)
        except BlockingIOError:
            return None
