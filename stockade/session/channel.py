"""The host's end of a session: checked frames to and from one agent over its stdin/stdout pipes,
without threads (the calling thread polls)."""

from __future__ import annotations

import collections
import os
import select
import time
from typing import IO

from stockade.session import protocol
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.protocol import Message


class Channel:
    def __init__(self, to_agent: IO[bytes], from_agent: IO[bytes]) -> None:
        self._files = (to_agent, from_agent)
        self._w, self._r = to_agent.fileno(), from_agent.fileno()
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
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
            poller = select.poll()
            poller.register(self._r, select.POLLIN)
            if self._outbox:
                poller.register(self._w, select.POLLOUT)
            left = None if deadline is None else min(max(deadline - time.monotonic(), 0), 3600)
            events = poller.poll(None if left is None else left * 1000)
            for fd, _ in events:
                if fd == self._w:
                    self._flush()
                else:
                    self._read()
            if not events and deadline is not None and time.monotonic() >= deadline:
                return None
        return self._inbox.popleft()

    def close(self) -> None:
        for f in self._files:
            f.close()

    def _flush(self) -> None:
        try:
            sent = os.write(self._w, self._outbox) if self._outbox else 0
        except BlockingIOError:
            sent = 0
        except BrokenPipeError:
            sent = len(self._outbox)  # the agent is gone; reading says so
        del self._outbox[:sent]

    def _read(self) -> None:
        try:
            chunk = os.read(self._r, 1 << 17)
        except BlockingIOError:
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
