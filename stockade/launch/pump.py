"""Drive a launch to its end on the calling thread: feed stdin, capture bounded output, and kill
the tree at the deadline or on cancel. One poll loop, no helper threads: a launch costs no
thread start-ups, and the caller's thread is the only one touching the handle.

Output can instead be *relayed* to the caller's own descriptors 1 and 2 (the command line), and
the caller's descriptor 0 relayed to the command's stdin: no descriptor of the caller's — a
terminal, a file opened for appending — ever enters the sandbox, where a command could read a
terminal's input or change its settings, or truncate the file. Relayed output counts against
the same limit: what comes beyond it is dropped and flagged. The relay never blocks the loop
(so the deadline still holds when the caller stops reading): it writes only after the
destination polled writable, at most PIPE_BUF bytes at a time, and reads no more of the
command's output meanwhile, which the command feels as a full pipe.

Windows cannot poll pipes, so there (`threaded`) a thread per stream reads or feeds it with
blocking calls, while the caller's thread waits for the command, watches the clock, and is still
the only one touching the handle. It waits for the command's own exit, not for the streams' end:
there, what ends the rest of the tree is wait() itself (the Job is terminated once its first
process exits), so a background process still holding stdout would otherwise keep the streams,
and the run, open until the deadline. Then what is left in the streams is drained, for at most
DRAIN seconds; a stream still open after that is cut and flagged. The semantics are otherwise the
same as the poll loop's, where the tree's end (the sandbox's pid 1 exiting) ends the streams."""

from __future__ import annotations

import abc
import contextlib
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from stockade.launch.backend import Exit, Handle

CANCEL_POLL = 0.05  # seconds between checks of a cancel event
KILL_POLL = 0.1  # seconds between kills of a tree that outlives its deadline or cancel
DRAIN = 5.0  # seconds for the threads to take what is left once the command's tree is gone
CHUNK = 65536
PIPE_BUF = 4096  # what a descriptor that polled writable takes without blocking
TAIL = 4096  # bytes of a relayed stream kept for hints

# Where the command's stdout or stderr goes: KEEP (captured within the limit), DISCARD (read
# and dropped), or a descriptor of this process to relay it to (within the limit).
KEEP = "keep"
DISCARD = "discard"
Sink = str | int


@dataclass
class Capture:
    """At most `limit` bytes of a stream; the rest is drained and flagged."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    taken: int = 0

    def take(self, chunk: bytes) -> None:
        """Count `chunk` in, keeping what fits within the limit."""
        room = max(self.limit - self.taken, 0)
        if len(chunk) > room:
            self.truncated = True
        self.taken += min(len(chunk), room)
        self._keep(chunk[:room])

    def _keep(self, kept: bytes) -> None:
        self.data += kept


@dataclass
class Discard(Capture):
    """A stream read and dropped: nothing kept, nothing cut."""

    def take(self, chunk: bytes) -> None:
        pass


@dataclass
class Forward(Capture):
    """At most `limit` bytes of a stream, written on to descriptor `fd` (nothing kept here);
    the rest is drained and flagged. Once `fd`'s reader is gone, nothing more is written; once
    writing to it failed otherwise (a full disk), nothing more either, and `failed` says why."""

    fd: int = -1
    pending: bytes = b""
    closed: bool = False
    failed: str = ""
    tail: bytes = b""  # the last TAIL bytes passed on (for hints about what went wrong)

    def _keep(self, kept: bytes) -> None:
        self.tail = (self.tail + kept)[-TAIL:]
        if not self.closed:
            self.pending += kept

    def flush_some(self, size: int = PIPE_BUF) -> None:
        try:
            written = os.write(self.fd, self.pending[:size])
        except BlockingIOError:
            return
        except BrokenPipeError:  # (the caller's reader went away; so does what is left)
            self.closed, self.pending = True, b""
            return
        except OSError as exc:  # (output lost: said in the result, never silently)
            self.closed, self.pending = True, b""
            self.failed = exc.strerror or str(exc)
            return
        self.pending = self.pending[written:]


@dataclass
class Outcome:
    end: Exit
    stdout: Capture
    stderr: Capture
    timed_out: bool = False
    cancelled: bool = False


class _Clock:
    """The deadline and the cancel event, and whether either has fired."""

    def __init__(self, timeout: float | None, cancel: threading.Event | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.cancel = cancel
        self.timed_out = self.cancelled = False

    @property
    def over(self) -> bool:
        """Whether the deadline or the cancel has fired."""
        return self.timed_out or self.cancelled

    def step(self) -> float | None:
        """How long the next wait may block: once fired, KILL_POLL (the kill is repeated)."""
        if self.over:
            return KILL_POLL
        step = CANCEL_POLL if self.cancel is not None else None
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0)
            step = left if step is None else min(step, left)
        return step

    def fired(self) -> bool:
        if not (self.timed_out or self.cancelled):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out = True
            elif self.cancel is not None and self.cancel.is_set():
                self.cancelled = True
            else:
                return False
            return True
        return False


def drive(handle: Handle, *, input: bytes | None, limit: int, timeout: float | None,
          cancel: threading.Event | None, threaded: bool = sys.platform == "win32",
          outputs: tuple[Sink, Sink] = (KEEP, KEEP), stdin_from: int | None = None) -> Outcome:
    """Run the launch to its end. `outputs`: where its stdout and stderr go (kept, dropped,
    or relayed to a descriptor of this process: (1, 2) for ours); `stdin_from`: a descriptor
    of this process (0: ours) whose data comes in on the handle's stdin pipe (instead of
    `input`)."""
    clock = _Clock(timeout, cancel)
    # Both relayed to one descriptor: the second through a duplicate, so the loop can wait on
    # each (a descriptor is registered once).
    shared = outputs[0] == outputs[1] and isinstance(outputs[0], int)
    out = capture_for(outputs[0], limit)
    err = capture_for(os.dup(outputs[1]) if shared else outputs[1], limit)
    try:
        (_pump_threads if threaded else _pump_poll)(handle, input or b"", out, err, clock,
                                                    stdin_from)
    finally:
        if shared:
            os.close(err.fd)  # type: ignore[attr-defined]
    while (end := handle.wait(clock.step())) is None:
        if clock.fired() or clock.over:
            handle.kill()
    return Outcome(end, out, err, clock.timed_out, clock.cancelled)


def capture_for(where: Sink, limit: int) -> Capture:
    """What takes a stream bound for `where` (KEEP, DISCARD or a descriptor)."""
    if where == KEEP:
        return Capture(limit)
    if where == DISCARD:
        return Discard(limit)
    assert isinstance(where, int)
    return Forward(limit, fd=where)


# --- the poll loop --------------------------------------------------------------------------

class _Ready(abc.ABC):
    """What to do when a registered descriptor is ready. `output`: the loop lasts while any
    handler of the command's output is registered."""

    output = False

    @abc.abstractmethod
    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None: ...


class _Read(_Ready):
    """The command's stdout or stderr, into a Capture (or through a Forward)."""

    output = True

    def __init__(self, stream: IO[bytes], capture: Capture) -> None:
        self.stream, self.capture = stream, capture

    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None:
        try:
            chunk = os.read(self.stream.fileno(), CHUNK)
        except BlockingIOError:
            return
        if not chunk:
            loop.unregister(self.stream)
            self.stream.close()
            return
        self.capture.take(chunk)
        if isinstance(self.capture, Forward) and self.capture.pending:
            loop.unregister(self.stream)  # read again once the caller has taken it all
            loop.register(self.capture.fd, selectors.EVENT_WRITE, _Flush(self))


class _Flush(_Ready):
    """The caller's descriptor, written while a relayed chunk is pending."""

    output = True

    def __init__(self, reader: _Read) -> None:
        self.reader = reader

    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None:
        forward = self.reader.capture
        assert isinstance(forward, Forward)
        forward.flush_some()
        if not forward.pending:
            loop.unregister(forward.fd)
            loop.register(self.reader.stream, selectors.EVENT_READ, self.reader)


class _Status(_Ready):
    """The backend's own status descriptor (Handle.status_reader), read as it comes."""

    def __init__(self, read: Callable[[], bool]) -> None:
        self.read = read

    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None:
        if not self.read():
            loop.unregister(fileobj)


class _Feed(_Ready):
    """`input` bytes, into the command's stdin, which is closed after them."""

    def __init__(self, stream: IO[bytes], data: bytes) -> None:
        self.stream, self.data = stream, memoryview(data)

    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None:
        try:
            sent = os.write(self.stream.fileno(), self.data[:CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:
            sent = len(self.data)  # the command stopped reading; that is its business
        self.data = self.data[sent:]
        if not self.data:
            loop.unregister(self.stream)
            self.stream.close()


class _Pass(_Ready):
    """A descriptor of the caller's (0: its stdin), into the command's stdin: read while
    nothing is pending, written while something is; the command's stdin closes when the
    caller's ends."""

    def __init__(self, source: int, stream: IO[bytes]) -> None:
        self.source, self.stream, self.pending = source, stream, b""

    def ready(self, loop: selectors.BaseSelector, fileobj: object) -> None:
        if fileobj == self.source:
            try:
                self.pending = os.read(self.source, CHUNK)  # (it polled readable)
            except OSError:
                self.pending = b""
            loop.unregister(self.source)
            if not self.pending:
                self.stream.close()
            else:
                loop.register(self.stream, selectors.EVENT_WRITE, self)
            return
        try:
            sent = os.write(self.stream.fileno(), self.pending)
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin: nothing more to pass
            loop.unregister(self.stream)
            self.stream.close()
            return
        self.pending = self.pending[sent:]
        if not self.pending:
            loop.unregister(self.stream)
            loop.register(self.source, selectors.EVENT_READ, self)

    def stop(self, loop: selectors.BaseSelector) -> None:
        for fileobj in (self.source, self.stream):
            with contextlib.suppress(KeyError, ValueError):
                loop.unregister(fileobj)
        self.stream.close()


def _pump_poll(handle: Handle, data: bytes, out: Capture, err: Capture, clock: _Clock,
               source: int | None) -> None:
    # poll, not epoll: the caller's descriptors may be regular files (always ready), which
    # epoll refuses.
    with selectors.PollSelector() as loop:
        for stream, capture in ((handle.stdout, out), (handle.stderr, err)):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                loop.register(stream, selectors.EVENT_READ, _Read(stream, capture))
        status = handle.status_reader()
        if status is not None:
            loop.register(status[0], selectors.EVENT_READ, _Status(status[1]))
        passing = None
        if handle.stdin is not None:
            os.set_blocking(handle.stdin.fileno(), False)
            if source is not None:
                passing = _Pass(source, handle.stdin)
                loop.register(source, selectors.EVENT_READ, passing)
            elif data:
                loop.register(handle.stdin, selectors.EVENT_WRITE, _Feed(handle.stdin, data))
            else:
                handle.stdin.close()
        while any(key.data.output for key in loop.get_map().values()):
            for key, _ in loop.select(clock.step()):
                key.data.ready(loop, key.fileobj)
            if clock.fired() or clock.over:
                # The streams end when the tree is gone. Again and again: the first kill may
                # ask the tree's root to end it, the next ones force it (Handle.kill).
                handle.kill()
        if passing is not None:
            passing.stop(loop)
    for capture in (out, err):  # what the caller's descriptor had no room for yet
        while isinstance(capture, Forward) and capture.pending:
            capture.flush_some(len(capture.pending))


# --- threads (Windows) ----------------------------------------------------------------------

def _pump_threads(handle: Handle, data: bytes, out: Capture, err: Capture,
                  clock: _Clock, source: int | None) -> None:
    cut = threading.Lock()  # taken to take a chunk in, and to end the taking
    readers = [(threading.Thread(target=_drain, args=(stream, capture, cut), daemon=True),
                capture)
               for stream, capture in ((handle.stdout, out), (handle.stderr, err))
               if stream is not None]
    workers = [reader for reader, _ in readers]
    if handle.stdin is not None and source is not None:  # not waited for: it may never end
        threading.Thread(target=_copy, args=(source, handle.stdin), daemon=True).start()
    elif handle.stdin is not None:
        workers.append(threading.Thread(target=_feed, args=(handle.stdin, data), daemon=True))
    for worker in workers:
        worker.start()
    while handle.wait(clock.step()) is None:
        if clock.fired() or clock.over:
            handle.kill()
    drained_by = time.monotonic() + DRAIN
    for worker in workers:
        worker.join(max(drained_by - time.monotonic(), 0))
    with cut:  # what a reader still takes after this is not the caller's any more
        for reader, capture in readers:
            if reader.is_alive():
                capture.truncated = True
                capture.limit = capture.taken  # (and it keeps nothing more)


def _drain(stream: IO[bytes], capture: Capture, cut: threading.Lock) -> None:
    with stream:
        while chunk := os.read(stream.fileno(), CHUNK):
            with cut:
                capture.take(chunk)
                while isinstance(capture, Forward) and capture.pending:
                    capture.flush_some(len(capture.pending))


def _feed(stream: IO[bytes], data: bytes) -> None:
    with stream, contextlib.suppress(OSError):  # (a broken pipe: the command's business)
        _write_all(stream.fileno(), data)


def _copy(source: int, stream: IO[bytes]) -> None:
    with stream, contextlib.suppress(OSError):
        while chunk := os.read(source, CHUNK):
            _write_all(stream.fileno(), chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:CHUNK]):]
