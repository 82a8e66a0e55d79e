"""What both guest agents share: a POSIX guest's (agent.py: one thread and a selector) and a
Windows Sandbox guest's (stockade/vm/wsb_agent.py: threads). `Serving` checks what the host
sends against the protocol (docs/protocol.md: the hello and its secret, command numbers, one
command at a time, the stdin window, one eof) and keeps the books of the command being run
(`Command`): its deadline, the stdin bytes not yet granted back, and its result. Each agent
subclasses both with its own I/O: how a command starts, is fed, is killed and is read.

The Windows Sandbox guest runs this module: it imports nothing POSIX-only.
"""

from __future__ import annotations

import hmac
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

from stockade.session import protocol
from stockade.session.errors import ProtocolError, StartFailure
from stockade.session.protocol import Message

MAX_WAIT = 3600.0  # seconds one wait may last (far deadlines are reached in several)
Status = tuple[int | None, int | None, float, float]  # exit code, signal, user s, system s


class Command(ABC):
    """The command being run, as the protocol counts it. `status` (and `exited`, when) is set
    once it has exited and been reaped: until then it runs, and may be killed."""

    def __init__(self, number: int, received: float, started: float,
                 timeout: float | None) -> None:
        self.number = number
        self.received = received  # when its exec arrived
        self.started = started
        self.deadline = None if timeout is None else started + timeout
        self.exited: float | None = None
        self.status: Status | None = None
        self.stdin_eof = False
        self.outstanding = 0  # stdin bytes received and not yet granted back
        self.timed_out = self.cancelled = False

    @abstractmethod
    def kill(self) -> None:
        """End the command's whole tree now."""

    @abstractmethod
    def streaming(self) -> bool:
        """Whether an output stream of it has yet to reach its end."""


C = TypeVar("C", bound=Command)


class Serving(ABC, Generic[C]):
    """The host's messages, checked and dispatched, for an agent whose commands are `C`s."""

    def __init__(self, nonce: bytes) -> None:
        self.nonce = nonce
        self.decoder = protocol.Decoder(protocol.TO_AGENT)
        self.authenticated = False
        self.last = 0  # the highest command number seen
        self.command: C | None = None
        self.running = True

    # --- what each agent does its own way ------------------------------------------------

    @abstractmethod
    def send(self, message: Message) -> None:
        """Queue `message` for the host."""

    @abstractmethod
    def _welcome(self, hello: dict) -> dict:
        """Take up the options of the host's (authenticated) hello; the agent's hello body."""

    @abstractmethod
    def _start(self, number: int, body: dict, received: float) -> None:
        """Start command `number` (an exec's body), make it `self.command` and send `started`;
        StartFailure when it cannot start."""

    @abstractmethod
    def _give_stdin(self, command: C, data: bytes) -> None:
        """Pass `data` (within the window) on to the command's stdin."""

    @abstractmethod
    def _end_stdin(self, command: C) -> None:
        """The host's stdin eof (the first): close the command's stdin once it is fed."""

    # --- the host's messages -------------------------------------------------------------

    def _received(self, chunk: bytes) -> None:
        """Handle what the host sent next; b"" when it has closed the session."""
        if not chunk:
            self.decoder.finish()
            self.running = False
            return
        for message in self.decoder.feed(chunk):
            self._handle(message)

    def _handle(self, message: Message) -> None:
        if not self.authenticated:
            if message.type != "hello":
                raise ProtocolError("auth_required", "the first message must be hello")
            if not hmac.compare_digest(bytes.fromhex(message.body["nonce"]), self.nonce):
                raise ProtocolError("auth_failed", "wrong session secret")
            introduction = self._welcome(message.body)
            self.authenticated = True
            self.send(Message("hello", body=introduction))
            return
        handler: Callable[[Message], None] | None = {
            "exec": self._exec, "data": self._stdin_data, "eof": self._stdin_eof,
            "cancel": self._cancel, "ping": self._ping, "shutdown": self._shutdown,
            "error": self._shutdown,
        }.get(message.type)
        if handler is None:
            raise ProtocolError("sequence_invalid", f"{message.type} after the handshake")
        handler(message)

    def _exec(self, message: Message) -> None:
        if self.command is not None:
            raise ProtocolError("busy", "one command at a time: wait for its result")
        if message.command <= self.last:
            raise ProtocolError("sequence_invalid", "command numbers must increase")
        self.last = message.command
        try:
            self._start(message.command, message.body, time.monotonic())
        except StartFailure as exc:
            self.send(Message("error", message.command,
                              body={"code": exc.code, "message": str(exc)}))

    def _current(self, message: Message) -> C | None:
        """The command `message` is about; None for one that has already ended."""
        if message.command > self.last:
            raise ProtocolError("sequence_invalid", f"command {message.command} was never started")
        command = self.command
        return command if command is not None and command.number == message.command else None

    def _stdin_data(self, message: Message) -> None:
        command = self._current(message)
        if command is None:
            return
        assert isinstance(message.body, bytes)
        if command.stdin_eof:
            raise ProtocolError("sequence_invalid", "stdin data after its eof")
        command.outstanding += len(message.body)
        if command.outstanding > protocol.STDIN_WINDOW:
            raise ProtocolError("window_exceeded", "stdin data beyond the granted window")
        self._give_stdin(command, message.body)

    def _stdin_eof(self, message: Message) -> None:
        command = self._current(message)
        if command is None:
            return
        if command.stdin_eof:
            raise ProtocolError("sequence_invalid", "a second stdin eof")
        command.stdin_eof = True
        self._end_stdin(command)

    def _cancel(self, message: Message) -> None:
        command = self._current(message)
        if command is not None and command.status is None:
            command.cancelled = True
            command.kill()

    def _ping(self, message: Message) -> None:
        self.send(Message("pong", body={"seq": message.body["seq"]}))

    def _shutdown(self, message: Message) -> None:
        self.running = False

    # --- the command's books -------------------------------------------------------------

    def _grant(self, command: C, count: int) -> None:
        """`count` stdin bytes of `command` written or dropped: the host may send as many."""
        if count:
            command.outstanding -= count
            self.send(Message("window", command.number, body={"bytes": count}))

    def _maybe_done(self) -> None:
        """Send the command's result once it has exited and its outputs have ended."""
        command = self.command
        if command is None or command.status is None or command.streaming():
            return
        exit_code, sig, user, system = command.status
        assert command.exited is not None
        self.send(Message("result", command.number, body={
            "exit_code": exit_code, "signal": sig, "timed_out": command.timed_out,
            "cancelled": command.cancelled,
            "start": round(command.started - command.received, 6),
            "wall": round(command.exited - command.started, 6), "user": user,
            "system": system}))
        self.command = None

    def _step(self) -> float | None:
        """How long the agent may wait for its next event: until the deadline, if any."""
        command = self.command
        if command is None or command.deadline is None or command.status is not None:
            return None
        return min(max(command.deadline - time.monotonic(), 0), MAX_WAIT)

    def _check_deadline(self) -> None:
        command = self.command
        if (command is not None and command.deadline is not None and command.status is None
                and not command.timed_out and time.monotonic() >= command.deadline):
            command.timed_out = True
            command.kill()
