"""Drive a launch to its end on the calling thread: feed stdin, capture bounded output, and kill
the tree at the deadline or on cancel. One selector, no helper threads: a launch costs no thread
start-ups, and the caller's thread is the only one touching the handle.

Windows cannot select on pipes, so there (`threaded`) a thread per stream reads or feeds it with
blocking calls, while the caller's thread waits for them, watches the clock, and is still the
only one touching the handle. The semantics are the same."""

from __future__ import annotations

import os
import selectors
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO

from stockade.launch.backend import Exit, Handle

CANCEL_POLL = 0.05  # seconds between checks of a cancel event


@dataclass
class Capture:
    """At most `limit` bytes of a stream; the rest is drained and flagged."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def take(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
        self.data += chunk[:max(room, 0)]


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

    def step(self) -> float | None:
        """How long the next wait may block."""
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
          cancel: threading.Event | None, threaded: bool = sys.platform == "win32") -> Outcome:
    clock = _Clock(timeout, cancel)
    out, err = Capture(limit), Capture(limit)
    (_pump_threads if threaded else _pump_selector)(handle, input or b"", out, err, clock)
    while (end := handle.wait(clock.step())) is None:
        if clock.fired():
            handle.kill()
    return Outcome(end, out, err, clock.timed_out, clock.cancelled)


def _pump_selector(handle: Handle, data: bytes, out: Capture, err: Capture,
                   clock: _Clock) -> None:
    with selectors.DefaultSelector() as selector:
        for stream, capture in ((handle.stdout, out), (handle.stderr, err)):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                selector.register(stream, selectors.EVENT_READ, capture)
        if handle.stdin is not None:
            _start_feeding(selector, handle, data)
        while selector.get_map():
            for key, _ in selector.select(clock.step()):
                _service(selector, key)
            if clock.fired():
                handle.kill()  # the streams end when the tree is gone


def _pump_threads(handle: Handle, data: bytes, out: Capture, err: Capture,
                  clock: _Clock) -> None:
    workers = [threading.Thread(target=_drain, args=(stream, capture), daemon=True)
               for stream, capture in ((handle.stdout, out), (handle.stderr, err))
               if stream is not None]
    if handle.stdin is not None:
        workers.append(threading.Thread(target=_feed, args=(handle.stdin, data), daemon=True))
    for worker in workers:
        worker.start()
    for worker in workers:
        while worker.is_alive():
            worker.join(clock.step())
            if clock.fired():
                handle.kill()  # the streams end when the tree is gone


def _drain(stream: IO[bytes], capture: Capture) -> None:
    with stream:
        while chunk := os.read(stream.fileno(), 65536):
            capture.take(chunk)


def _feed(stream: IO[bytes], data: bytes) -> None:
    with stream:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(stream.fileno(), view[:65536]):]
        except OSError:
            pass  # the command stopped reading (a broken pipe); that is its business


def _start_feeding(selector: selectors.BaseSelector, handle: Handle, data: bytes) -> None:
    stream = handle.stdin
    assert stream is not None
    if not data:
        stream.close()
        return
    os.set_blocking(stream.fileno(), False)
    selector.register(stream, selectors.EVENT_WRITE, memoryview(data))


def _service(selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    stream = key.fileobj
    if isinstance(key.data, Capture):
        try:
            chunk = os.read(key.fd, 65536)
        except BlockingIOError:
            return
        if chunk:
            key.data.take(chunk)
            return
    else:
        try:
            sent = os.write(key.fd, key.data[:65536])
        except BlockingIOError:
            return
        except BrokenPipeError:
            sent = len(key.data)  # the command stopped reading; that is its business
        if sent < len(key.data):
            selector.modify(stream, selectors.EVENT_WRITE, key.data[sent:])
            return
    selector.unregister(stream)
    stream.close()
