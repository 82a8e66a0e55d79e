"""The Windows Sandbox guest's session agent: docs/protocol.md served on one byte stream (a TCP
connection to the host, or the spool of a guest without a network: wsb_spool), with threads
where the POSIX agent (stockade/session/agent.py) uses a selector, since Windows can wait on
sockets but not on pipes. What the host sends is checked, and a command's books kept, by the
code both agents share (stockade/session/serving.py).

It runs as the guest's administrator and starts each command through `spawn`: in the guest,
wsb_winproc's, which runs it as the standard guest user in a Job of its own whose whole tree
ends when the command's own process exits, at its timeout and on `cancel` (then `result` says
`signal` 9, as from the POSIX agent). The logic is the same with any `spawn`: the tests run it
with POSIX processes, and with in-process fakes in an interpreter made to look like Windows.

Threads: one reads the host, one writes to it (every frame goes through the `Outbox`), and
per command one waits for its exit, one feeds its stdin and one reads each output stream. Only
the main thread decides; the others post events on its queue. Output goes to the host as it is
read, never held until the end; once OUTPUT_HIGH bytes of output wait for the host, a reader
waits too, and the command blocks on its pipe (protocol rule 7). A stream's `eof` is sent by
the main thread only after its reader has ended, so it follows every byte of that stream.
"""

from __future__ import annotations

import collections
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import BinaryIO, Protocol

from stockade import __version__
from stockade.session import protocol
from stockade.session.errors import ProtocolError
from stockade.session.protocol import CHUNK, STDERR, STDOUT, Message
from stockade.session.serving import Command, Serving, Status

OUTPUT_HIGH = 1 << 20  # bytes of output queued for the host before readers wait
WRITE_BATCH = 256 << 10  # bytes the writer joins into one write
READ_SIZE = 1 << 17
STOP_FLUSH = 5.0  # seconds the agent's last frames may take to leave when it stops
KILLED = 9  # the `signal` a command the agent ended reports (SIGKILL's number, as on POSIX)


class Process(Protocol):
    """A started command. `stdin` is the agent's (unbuffered) end of its input, `stdout` and
    `stderr` of its outputs; each is closed by the agent."""

    pid: int
    stdin: BinaryIO
    stdout: BinaryIO
    stderr: BinaryIO

    def wait(self) -> None:
        """Return once the command's own process has exited."""

    def kill(self) -> None:
        """End the command's whole tree now (idempotent)."""

    def finish(self) -> Status:
        """After `wait`: end whatever the command left running and report how it ended."""


# (argv, cwd, env) -> the started command; StartFailure when it cannot start
Spawn = Callable[[list[str], str, dict[str, str]], Process]


class Transport(Protocol):
    def read(self) -> bytes:
        """What the host sent next, waiting for it; b"" once the host has ended."""

    def write(self, data: bytes) -> None:
        """Send all of `data`; OSError once the host is gone."""

    def close(self) -> None: ...


class SocketTransport:
    """The host's TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        self._sock = sock

    def read(self) -> bytes:
        return self._sock.recv(READ_SIZE)

    def write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # (ends the host reader's wait, and the host's)
        except OSError:
            pass  # (the host has gone already)
        self._sock.close()


class Outbox:
    """Frames for the host, written in order by a thread of their own. `put(output=True)`
    waits while OUTPUT_HIGH bytes of output are queued. Once a write fails (the host is gone)
    everything is dropped and `gone` is called."""

    def __init__(self, write: Callable[[bytes], None], gone: Callable[[], None]) -> None:
        self._write, self._gone = write, gone
        self._frames: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._ready = threading.Condition()
        self._output = 0
        self._broken = self._closing = False
        self._thread = threading.Thread(target=self._run, name="stockade-outbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, frame: bytes, output: bool = False) -> None:
        with self._ready:
            if output:
                self._ready.wait_for(lambda: self._output < OUTPUT_HIGH or self._broken
                                     or self._closing)
                if self._closing:
                    return  # (the session is over: what a command still writes goes nowhere)
            if not self._broken:
                self._output += len(frame) if output else 0
                self._frames.append((frame, output))
                self._ready.notify_all()

    def close(self, timeout: float) -> None:
        """Write what is queued (within `timeout` seconds), then stop."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._frames or self._closing)
                if not self._frames:
                    return
                batch, output = bytearray(), 0
                while self._frames and len(batch) < WRITE_BATCH:
                    frame, counted = self._frames.popleft()
                    batch += frame
                    output += len(frame) if counted else 0
            try:
                self._write(bytes(batch))
            except OSError:
                with self._ready:
                    self._broken = True
                    self._frames.clear()
                    self._ready.notify_all()
                self._gone()
                return
            with self._ready:
                self._output -= output
                self._ready.notify_all()


class _Stdin:
    """Feeds a command's stdin from its own thread; every byte given is granted back once
    written, or dropped (the command closed its stdin or ended)."""

    def __init__(self, pipe: BinaryIO, grant: Callable[[int], None]) -> None:
        self._pipe, self._grant = pipe, grant
        self._items: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="stockade-stdin", daemon=True).start()

    def give(self, data: bytes) -> None:
        self._items.put(data)

    def end(self) -> None:
        self._items.put(None)

    def _run(self) -> None:
        open_ = True
        while (data := self._items.get()) is not None:
            if open_:
                try:
                    _write_all(self._pipe, data)
                except (OSError, ValueError):  # it stopped reading, or ended
                    open_ = False
                    _close(self._pipe)
            self._grant(len(data))
        _close(self._pipe)


class _Command(Command):
    def __init__(self, number: int, process: Process, received: float,
                 timeout: float | None, stdin: _Stdin) -> None:
        super().__init__(number, received, time.monotonic(), timeout)
        self.process, self.stdin = process, stdin
        self.open = {STDOUT, STDERR}

    def kill(self) -> None:
        self.process.kill()

    def streaming(self) -> bool:
        return bool(self.open)


class Agent(Serving[_Command]):
    def __init__(self, nonce: bytes, transport: Transport, spawn: Spawn,
                 observed: dict[str, int] | None = None) -> None:
        super().__init__(nonce)
        self.transport = transport
        self.spawn = spawn
        self.observed = observed or {}
        self.events: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.outbox = Outbox(transport.write, lambda: self.events.put(("host_gone",)))
        self.status = 0

    def serve(self) -> int:
        """Run until the host shuts the session down or goes away; the exit status."""
        self.outbox.start()
        threading.Thread(target=self._read_host, name="stockade-host", daemon=True).start()
        try:
            while self.running:
                try:
                    event = self.events.get(timeout=self._step())
                except queue.Empty:
                    event = None
                if event is not None:
                    getattr(self, "_on_" + event[0])(*event[1:])
                self._check_deadline()
        except ProtocolError as exc:
            self.send(Message("error", body={"code": exc.code, "message": exc.message}))
            self.status = 2
        return self._stop()

    def send(self, message: Message, output: bool = False) -> None:
        self.outbox.put(protocol.encode(message), output)

    # --- events --------------------------------------------------------------------------

    def _on_host(self, chunk: bytes) -> None:
        self._received(chunk)

    def _on_host_gone(self) -> None:
        self.running, self.status = False, 1

    def _on_exited(self, number: int, when: float) -> None:
        command = self.command
        assert command is not None and command.number == number
        command.exited = when
        exit_code, sig, user, system = command.process.finish()  # (the rest of its tree ends)
        if command.timed_out or command.cancelled:  # (ended by the agent: as on POSIX)
            exit_code, sig = None, KILLED
        command.status = exit_code, sig, user, system
        command.stdin.end()
        self._maybe_done()

    def _on_output_end(self, number: int, stream: int) -> None:
        command = self.command
        assert command is not None and command.number == number
        command.open.discard(stream)
        self.send(Message("eof", number, stream))
        self._maybe_done()

    def _on_granted(self, number: int, count: int) -> None:
        command = self.command
        if command is not None and command.number == number:
            self._grant(command, count)

    # --- the host's messages -------------------------------------------------------------

    def _welcome(self, hello: dict) -> dict:
        if hello.get("keep_detached"):  # (refused, never ignored)
            raise ProtocolError("field_invalid", "keep_detached: this agent cannot keep "
                                "what commands detach")
        return {"agent": f"stockade {__version__} (windows-sandbox)", "pid": os.getpid(),
                "observed": self.observed}

    def _start(self, number: int, body: dict, received: float) -> None:
        process = self.spawn(body["argv"], body["cwd"], body["env"])
        stdin = _Stdin(process.stdin, lambda count: self.events.put(("granted", number, count)))
        self.command = _Command(number, process, received, body.get("timeout"), stdin)
        self.send(Message("started", number, body={"pid": process.pid}))
        for stream, pipe in ((STDOUT, process.stdout), (STDERR, process.stderr)):
            threading.Thread(target=self._read_output, args=(number, stream, pipe),
                             name="stockade-output", daemon=True).start()
        threading.Thread(target=self._wait, args=(number, process), name="stockade-wait",
                         daemon=True).start()

    def _give_stdin(self, command: _Command, data: bytes) -> None:
        command.stdin.give(data)

    def _end_stdin(self, command: _Command) -> None:
        command.stdin.end()

    # --- the command's threads -----------------------------------------------------------

    def _read_host(self) -> None:
        try:
            while chunk := self.transport.read():
                self.events.put(("host", chunk))
        except OSError:
            pass  # (reset: the same as an end)
        self.events.put(("host", b""))

    def _read_output(self, number: int, stream: int, pipe: BinaryIO) -> None:
        try:
            while chunk := pipe.read(CHUNK):
                self.send(Message("data", number, stream, chunk), output=True)
        except (OSError, ValueError):
            pass  # (closed under it: the agent is stopping)
        finally:
            _close(pipe)
            self.events.put(("output_end", number, stream))

    def _wait(self, number: int, process: Process) -> None:
        process.wait()
        self.events.put(("exited", number, time.monotonic()))

    # --- the end of the session -------------------------------------------------------

    def _stop(self) -> int:
        """End whatever still runs, send what is queued for the host, and return the
        status."""
        command = self.command
        if command is not None and command.status is None:
            command.process.kill()
            command.process.wait()
            command.process.finish()
            command.stdin.end()
        self.outbox.close(STOP_FLUSH)
        self.transport.close()
        return self.status


def _write_all(pipe: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[pipe.write(view):]


def _close(pipe: BinaryIO) -> None:
    try:
        pipe.close()
    except OSError:
        pass
