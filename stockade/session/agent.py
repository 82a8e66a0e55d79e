"""The guest agent (`stockade agent`): runs inside a sandbox, as its command, and runs the
commands its host asks for, one at a time, over the session protocol on its stdin/stdout.

Before any frame the host writes the sandbox's 32-byte secret (the pipe pair is private to the
host, so this is the out-of-band hand-over); the first frame must then be a `hello` carrying the
same secret, compared in constant time. Every command is a child of the agent (see child.py),
its output is forwarded as it arrives, its stdin is fed within the window the agent grants, and
its whole process group is killed at its timeout, on `cancel`, and — with everything else it
left behind — when it exits. A session the host opens with `keep_detached` keeps what a command
detached (processes in a session of their own) when the command exits by itself, until the
session ends (see `_spared`). Any protocol violation is answered with a fatal `error` and ends
the agent, which ends the sandbox. The checks, and a command's books, are serving.py's (the
Windows Sandbox guest's agent shares them).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import struct
import sys
import termios
from collections.abc import Callable

from stockade import __version__
from stockade.linux.privilege import capabilities_now
from stockade.linux.syscalls import prctl
from stockade.session import protocol
from stockade.session.child import Child, reap_exited, sessions, sweep
from stockade.session.errors import ProtocolError
from stockade.session.protocol import CHUNK, STDERR, STDOUT, Message
from stockade.session.serving import Command, Serving

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
OUTPUT_HIGH = 1 << 20  # bytes queued for the host before the agent stops reading commands' output


class _Command(Command):
    """The command being run: its child, its stdin backlog, and its open outputs."""

    def __init__(self, number: int, child: Child, timeout: float | None, received: float,
                 kept: frozenset[int]) -> None:
        super().__init__(number, received, child.started, timeout)
        self.kept = kept  # the sessions kept before it started (keep_detached)
        self.child = child
        self.stdin_backlog = bytearray()
        self.stdin_open = True
        self.outputs = {child.stdout.fileno(): (STDOUT, child.stdout),
                        child.stderr.fileno(): (STDERR, child.stderr)}

    def kill(self) -> None:
        self.child.kill()

    def streaming(self) -> bool:
        return bool(self.outputs)


class Agent(Serving[_Command]):
    def __init__(self, nonce: bytes, rfd: int = 0, wfd: int = 1) -> None:
        super().__init__(nonce)
        self.rfd, self.wfd = rfd, wfd
        self.selector = selectors.DefaultSelector()
        self.outbox = bytearray()
        self.keep_detached = False  # the host's, in its hello: a command cannot set it

    def serve(self) -> int:
        """Run until the host shuts the session down or goes away; the exit status."""
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.selector.register(self.rfd, selectors.EVENT_READ, self._from_host)
        try:
            while self.running:
                for key, _ in self.selector.select(self._step()):
                    # (a handler earlier in the batch may have closed it: the command's end
                    # closes its pipes, whose events may be in the same batch)
                    if self.selector.get_map().get(key.fd) is key:
                        key.data(key.fd)
                self._check_deadline()
        except ProtocolError as exc:
            with contextlib.suppress(OSError):  # best effort: the host may be gone
                self.send(Message("error", body={"code": exc.code, "message": exc.message}))
            return self._stop(2)
        except BrokenPipeError:
            return self._stop(1)  # the host is gone
        return self._stop(0)

    # --- the host's side ---------------------------------------------------------------------

    def send(self, message: Message) -> None:
        self.outbox += protocol.encode(message)
        self._flush(self.wfd)

    def _flush(self, fd: int) -> None:
        try:
            sent = os.write(self.wfd, self.outbox) if self.outbox else 0
        except BlockingIOError:
            sent = 0
        del self.outbox[:sent]
        self._watch(self.wfd, selectors.EVENT_WRITE, self._flush, bool(self.outbox))
        if self.command is not None:
            for output in self.command.outputs:
                self._watch(output, selectors.EVENT_READ, self._from_output,
                            len(self.outbox) < OUTPUT_HIGH)

    def _from_host(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 17)
        except BlockingIOError:
            return
        self._received(chunk)

    def _welcome(self, hello: dict) -> dict:
        if hello.get("keep_detached"):
            self._keep_detached()
        return _introduce()

    def _start(self, number: int, body: dict, received: float) -> None:
        kept = sessions() if self.keep_detached else frozenset()  # (no command runs: all kept)
        child = Child(body["argv"], body["cwd"], body["env"])
        self.command = _Command(number, child, body.get("timeout"), received, kept)
        for stream in (child.stdin, child.stdout, child.stderr):
            os.set_blocking(stream.fileno(), False)
        self.selector.register(child.pidfd, selectors.EVENT_READ, self._exited)
        self.send(Message("started", number, body={"pid": child.pid}))

    def _give_stdin(self, command: _Command, data: bytes) -> None:
        if command.stdin_open:
            command.stdin_backlog += data
            self._feed(command.child.stdin.fileno())
        else:
            self._grant(command, len(data))

    def _end_stdin(self, command: _Command) -> None:
        if command.stdin_open and not command.stdin_backlog:
            self._close_stdin(command)

    # --- the command's side ------------------------------------------------------------------

    def _feed(self, fd: int) -> None:
        command = self.command
        assert command is not None
        try:
            written = os.write(fd, command.stdin_backlog[:CHUNK])
        except BlockingIOError:
            written = 0
        except BrokenPipeError:  # it stopped reading: the rest is dropped (and granted back)
            self._close_stdin(command)
            return
        del command.stdin_backlog[:written]
        self._grant(command, written)
        self._watch(fd, selectors.EVENT_WRITE, self._feed, bool(command.stdin_backlog))
        if command.stdin_eof and not command.stdin_backlog:
            self._close_stdin(command)

    def _close_stdin(self, command: _Command) -> None:
        self._watch(command.child.stdin.fileno(), selectors.EVENT_WRITE, self._feed, False)
        command.child.stdin.close()
        command.stdin_open = False
        self._grant(command, len(command.stdin_backlog))
        command.stdin_backlog.clear()

    def _from_output(self, fd: int) -> None:
        command = self.command
        assert command is not None
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if chunk:
            self.send(Message("data", command.number, command.outputs[fd][0], chunk))
            return
        self._end_output(command, fd)
        self._maybe_done()

    def _end_output(self, command: _Command, fd: int) -> None:
        stream, pipe = command.outputs.pop(fd)
        self._watch(fd, selectors.EVENT_READ, self._from_output, False)
        pipe.close()
        self.send(Message("eof", command.number, stream))

    def _exited(self, fd: int) -> None:
        command = self.command
        assert command is not None
        self.selector.unregister(fd)
        command.status = command.child.reap(self._spared(command))
        command.exited = command.child.exited
        if command.stdin_open:
            self._close_stdin(command)
        # What the command and every process killed with it wrote is in its pipes now; a
        # process kept alive (keep_detached) may hold them open, so the result does not wait
        # for their end: what they hold is sent, then they are closed (a later write there
        # gets EPIPE).
        for output in list(command.outputs):
            self._drain(command, output)
        self._maybe_done()

    def _drain(self, command: _Command, fd: int) -> None:
        left = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
        while left > 0:
            chunk = os.read(fd, min(left, CHUNK))
            if not chunk:
                break
            left -= len(chunk)
            self.send(Message("data", command.number, command.outputs[fd][0], chunk))
        self._end_output(command, fd)

    def _spared(self, command: _Command) -> Callable[[int], bool]:
        """Which sessions' processes outlive `command` (by their session id): none, unless
        the host opened the session with keep_detached. Then, when it exited by itself, every
        session but the agent's own — the command's process group, and what left the group
        but not the session, are killed; what detached (setsid) lives on — and when it was
        stopped (timeout, cancel), only the sessions kept before it started: a stop kills
        everything the command started."""
        if not self.keep_detached:
            return lambda session: False
        if command.timed_out or command.cancelled:
            return command.kept.__contains__
        own = os.getsid(0)
        return lambda session: session != own

    def _keep_detached(self) -> None:
        """Keep what commands detach (see `_spared`), and reap it when it exits between
        commands: SIGCHLD wakes the loop."""
        self.keep_detached = True
        wake, woken = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # SA_RESTART: Python installs handlers without it, and then a SIGCHLD fails with EINTR
        # what C code does not retry — a mmap pid 1 holds under its memory watch (seccomp user
        # notification), in malloc or dlopen (os.wait4's first import), ending the agent.
        signal.siginterrupt(signal.SIGCHLD, False)
        signal.set_wakeup_fd(woken)
        self.selector.register(wake, selectors.EVENT_READ, self._child_exited)

    def _child_exited(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 256):
                pass
        command = self.command
        reap_exited(command.child.pid if command is not None and command.status is None
                    else None)

    # --- plumbing ----------------------------------------------------------------------------

    def _watch(self, fd: int, events: int, callback: Callable[[int], None], on: bool) -> None:
        """Register or unregister `fd` (one kind of interest per descriptor)."""
        registered = fd in self.selector.get_map()
        if on and not registered:
            self.selector.register(fd, events, callback)
        elif not on and registered:
            self.selector.unregister(fd)

    def _stop(self, status: int) -> int:
        """Kill whatever still runs, flush what is queued for the host, and return `status`."""
        if self.command is not None:
            self.command.child.kill()
            if self.command.status is None:
                self.command.child.reap()
        sweep()  # what a session kept (keep_detached) ends with it
        os.set_blocking(self.wfd, True)
        try:
            os.write(self.wfd, self.outbox)
        except OSError:
            pass
        return status


def _introduce() -> dict:
    return {"agent": f"stockade {__version__}", "pid": os.getpid(),
            "observed": capabilities_now()}


def _read_nonce(fd: int) -> bytes | None:
    nonce = b""
    while len(nonce) < protocol.NONCE_SIZE:
        chunk = os.read(fd, protocol.NONCE_SIZE - len(nonce))
        if not chunk:
            return None
        nonce += chunk
    return nonce


def main() -> int:
    """Serve one session on stdin/stdout; the exit status."""
    # Non-dumpable: no process of a session can open the agent's /proc/PID/fd or memory.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    nonce = _read_nonce(0)
    if nonce is None:
        print("stockade agent: no session secret on stdin", file=sys.stderr)
        return 2
    return Agent(nonce).serve()
