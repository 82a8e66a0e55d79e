"""The channel of a guest without a network (`network.mode = "none"`: the `.wsb` says
`Networking` `Disable`, so there is no TCP to the host): two append-only files in the per-boot
rendezvous folder, the one read-write folder both sides share.

    to-guest        the host appends, the agent reads
    to-host         the agent appends, the host reads
    to-guest.end    made by the host once it has ended its stream (closing the session)
    to-host.end     made by the agent likewise

Each write is a record: its length (4 bytes, big-endian), an HMAC-SHA256 of its number in the
stream (8 bytes) and its bytes, under a key of this stream's derived from the boot's secret
(which the guest entry took and deleted before any command ran, and which never is in the
folder after), then its bytes. A command that can reach the folder can append to a file, but
not a record the reader accepts: the first one that is not the stream's next ends the stream
(SpoolForged).

A reader looks for what was added since it last looked: every POLL_FAST seconds while bytes
have arrived in the last ACTIVE seconds, every POLL_IDLE seconds otherwise. A writer flushes
every write to the file (FlushFileBuffers on Windows), so that the other end of the mapping
sees it. On top, the protocol's own framing, as on any other transport. The host makes both
files before the boot (new, empty, never through a link), and both sides open them before
any command runs; an end marker is made new, never through a link either.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from collections.abc import Callable

from stockade.session.channel import READ_SIZE, FramedChannel
from stockade.session.errors import ProtocolError

TO_GUEST, TO_HOST = "to-guest", "to-host"
END = ".end"
POLL_FAST = 0.01  # seconds between looks while data flows
POLL_IDLE = 0.1  # seconds between looks once it has not for ACTIVE seconds
ACTIVE = 1.0
MAX_RECORD = 1 << 20  # bytes of one record's data
_RECORD = struct.Struct(">I32s")
# binary on Windows, not inherited, never through a final link where the platform says so
_FLAGS = (getattr(os, "O_BINARY", 0) | getattr(os, "O_NOINHERIT", 0) | getattr(os, "O_CLOEXEC", 0)
          | getattr(os, "O_NOFOLLOW", 0))


def _open(path: str, flags: int) -> int:
    return os.open(path, flags | _FLAGS, 0o600)


class SpoolForged(ConnectionError):
    """The spool holds bytes that are not its writer's next record."""


def stream_key(secret: bytes, name: str) -> bytes:
    """The key of spool file `name`'s records, from the boot's secret."""
    return hmac.new(secret, b"stockade-spool-v1 " + name.encode(), hashlib.sha256).digest()


def _mac(key: bytes, number: int, data: bytes) -> bytes:
    return hmac.new(key, number.to_bytes(8, "big") + data, hashlib.sha256).digest()


class SpoolReader:
    """The bytes of one spool file's records, as they come, each checked."""

    def __init__(self, path: str, key: bytes, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._fd = _open(path, os.O_RDONLY)
        self._end = path + END
        self._key = key
        self._buffer = bytearray()
        self._number = 0
        self._forged = ""
        self._clock, self._sleep = clock, sleep
        self._last = clock()

    def poll(self) -> bytes | None:
        """The data of the records added since the last look; None if none, b"" once the
        writer has ended its stream and everything before its end was read. SpoolForged for
        bytes that are not the stream's next record."""
        ended = os.path.lexists(self._end)  # (first: what was written before it is read next)
        raw = os.read(self._fd, READ_SIZE)
        if raw:
            self._last = self._clock()
            self._buffer += raw
        data = self._records()
        if data:
            return data
        if self._forged:
            raise SpoolForged(self._forged)
        if raw or not ended:
            return None
        if self._buffer:
            raise SpoolForged("the spool ends inside a record")
        return b""

    def _records(self) -> bytes:
        """The data of the whole records buffered, up to the first that is not the stream's
        next (which, and all after it, is never read: `_forged` says why)."""
        data = bytearray()
        while not self._forged and len(self._buffer) >= _RECORD.size:
            size, mac = _RECORD.unpack_from(self._buffer)
            if size > MAX_RECORD:
                self._forged = f"a spool record of {size} bytes"
                break
            if len(self._buffer) < _RECORD.size + size:
                break
            body = bytes(self._buffer[_RECORD.size:_RECORD.size + size])
            if not hmac.compare_digest(mac, _mac(self._key, self._number, body)):
                self._forged = "a spool record that is not its writer's next"
                break
            del self._buffer[:_RECORD.size + size]
            self._number += 1
            data += body
        return bytes(data)

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
    def __init__(self, path: str, key: bytes) -> None:
        self._key = key
        self._number = 0
        # (append mode: each write lands at the end as it is then, never over bytes another
        # process added since this one last wrote)
        self._fd = _open(path, os.O_WRONLY | os.O_APPEND)
        self._end = path + END

    def write(self, data: bytes) -> None:
        for start in range(0, len(data), MAX_RECORD):
            body = data[start:start + MAX_RECORD]
            # (one write per record: in append mode it lands whole, at the end)
            view = memoryview(_RECORD.pack(len(body), _mac(self._key, self._number, body))
                              + body)
            self._number += 1
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

    def __init__(self, folder: str, secret: bytes) -> None:
        self._reader = SpoolReader(os.path.join(folder, TO_GUEST), stream_key(secret, TO_GUEST))
        self._writer = SpoolWriter(os.path.join(folder, TO_HOST), stream_key(secret, TO_HOST))

    def read(self) -> bytes:
        return self._reader.read()

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def close(self) -> None:
        self._writer.close()
        self._reader.close()


class SpoolChannel(FramedChannel):
    """The host's end: stockade/session/channel.py's framing on the spool."""

    def __init__(self, folder: str, secret: bytes) -> None:
        super().__init__()
        self._reader = SpoolReader(os.path.join(folder, TO_HOST), stream_key(secret, TO_HOST))
        self._writer = SpoolWriter(os.path.join(folder, TO_GUEST), stream_key(secret, TO_GUEST))
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
        while (data := self._poll()) is None:
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
        return data if data is not None else self._poll()

    def _poll(self) -> bytes | None:
        try:
            return self._reader.poll()
        except SpoolForged as exc:
            raise ProtocolError("auth_failed", f"the agent's spool: {exc}") from None
