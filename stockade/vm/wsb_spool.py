"""The channel of a guest without a network (`network.mode = "none"`: the `.wsb` says
`Networking` `Disable`, so there is no TCP to the host): two append-only files in the per-boot
rendezvous folder, the one read-write folder both sides share.

    to-guest        the host appends, the agent reads
    to-host         the agent appends, the host reads
    to-guest.end    made by the host once it has ended its stream (closing the session)
    to-host.end     made by the agent likewise

A reader looks for what was added since it last looked: every POLL_FAST seconds while bytes
have arrived in the last ACTIVE seconds, every POLL_IDLE seconds otherwise. A writer flushes
every write to the file (FlushFileBuffers on Windows), so that the other end of the mapping
sees it. On top, the protocol's own framing, as on any other transport. The host makes both
files before the boot (new, empty, never through a link), and both sides open them before
any command runs; an end marker is made new, never through a link either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from stockade.session.channel import READ_SIZE, FramedChannel

TO_GUEST, TO_HOST = "to-guest", "to-host"
END = ".end"
POLL_FAST = 0.01  # seconds between looks while data flows
POLL_IDLE = 0.1  # seconds between looks once it has not for ACTIVE seconds
ACTIVE = 1.0
# binary on Windows, not inherited, never through a final link where the platform says so
_FLAGS = (getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0) | getattr(os, "O_CLOEXEC", 0)
          | getattr(os, "O_NOFOLLOW", 0))


def _open(path: str, flags: int) -> int:
    return os.open(path, flags | _FLAGS, 0o600)


class SpoolReader:
    """The bytes appended to one spool file, as they come."""

    def __init__(self, path: str, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._fd = _open(path, os.O_RDONLY)
        self._end = path + END
        self._clock, self._sleep = clock, sleep
        self._last = clock()

    def poll(self) -> bytes | None:
        """What was added since the last look; None if nothing, b"" once the writer has
        ended its stream and everything before its end was read."""
        ended = os.path.lexists(self._end)  # (first: what was written before it is read next)
        data = os.read(self._fd, READ_SIZE)
        if data:
            self._last = self._clock()
            return data
        return b"" if ended else None

    def interval(self) -> float:
        """How long to wait before the next look."""
        return POLL_FAST if self._clock() - self._last < ACTIVE else POLL_IDLE

    def read(self) -> bytes:
        """What was added next, waiting for it (b"" at the end)."""
        while (data := self.poll()) is None:
            self._sleep(self.interval())
        return data

    def close(self) -> None:
        os.close(self._fd)


class SpoolWriter:
    def __init__(self, path: str) -> None:
        # (append mode: each write lands at the end as it is then, never over bytes another
        # process added since this one last wrote)
        self._fd = _open(path, os.O_WRONLY | os.O_APPEND)
        self._end = path + END

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)

    def close(self) -> None:
        """End the stream: the reader sees its end once it has read everything before."""
        os.close(self._fd)
        try:
            os.close(_open(self._end, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass  # (ended already)


def create(folder: str) -> None:
    """The two empty spool files, made by the host before the boot."""
    for name in (TO_GUEST, TO_HOST):
        os.close(_open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL))


class SpoolTransport:
    """The agent's end (wsb_agent.Transport)."""

    def __init__(self, folder: str) -> None:
        self._reader = SpoolReader(os.path.join(folder, TO_GUEST))
        self._writer = SpoolWriter(os.path.join(folder, TO_HOST))

    def read(self) -> bytes:
        return self._reader.read()

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def close(self) -> None:
        self._writer.close()
        self._reader.close()


class SpoolChannel(FramedChannel):
    """The host's end: stockade/session/channel.py's framing on the spool."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self._reader = SpoolReader(os.path.join(folder, TO_HOST))
        self._writer = SpoolWriter(os.path.join(folder, TO_GUEST))
        self._pending: bytes | None = None
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._writer.close()  # (its end tells the agent the session is over)
            finally:
                self._reader.close()

    def _wait(self, seconds: float, sending: bool) -> tuple[bool, bool]:
        if sending:
            return False, True  # (appending to a file never waits)
        deadline = time.monotonic() + seconds
        while (data := self._reader.poll()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False, False
            time.sleep(min(self._reader.interval(), left))
        self._pending = data
        return True, False

    def _write(self, data: bytearray) -> int:
        try:
            self._writer.write(bytes(data))
        except OSError:
            pass  # (the guest is gone: reading reports it)
        return len(data)

    def _read_some(self) -> bytes | None:
        data, self._pending = self._pending, None
        return data if data is not None else self._reader.poll()
