"""One command's exchange with the agent, on the host: `exec`, stdin sent within the window the
agent grants, output yielded as it arrives (and captured within the output bound), then the
agent's `result`. Anything out of order from the agent is a ProtocolError."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass

from stockade.errors import StartError
from stockade.launch.pump import CANCEL_POLL, Capture
from stockade.session.channel import Channel
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.protocol import CHUNK, STDERR, STDIN_WINDOW, STDOUT, STREAM_NAMES, Message

GRACE = 5.0  # seconds the agent may take past a command's timeout, or after a cancel


@dataclass(frozen=True)
class Output:
    """A chunk of a command's output, as it arrived: `stream` is "stdout" or "stderr"."""

    stream: str
    data: bytes


@dataclass
class Ending:
    """What the agent reported at the end of a command, and the bounded captures."""

    result: dict
    stdout: Capture
    stderr: Capture


class Exchange:
    def __init__(self, channel: Channel, number: int, input: bytes | None, limit: int,
                 timeout: float | None, cancel: threading.Event | None) -> None:
        self.channel = channel
        self.number = number
        self.input = memoryview(input or b"")
        self.window = STDIN_WINDOW
        self.eof_sent = False
        self.captures = {STDOUT: Capture(limit), STDERR: Capture(limit)}
        self.open = {STDOUT, STDERR}
        self.started = False
        self.cancel = cancel
        self.give_up = None if timeout is None else time.monotonic() + timeout + GRACE
        self.cancel_sent = False

    def run(self, body: dict) -> Generator[Output, None, Ending]:
        """Send `exec` with `body`, yield the output, return the Ending."""
        self.channel.send(Message("exec", self.number, body=body))
        self._feed()
        while True:
            message = self.channel.receive(self._step())
            if message is None:
                self._tick()
                continue
            if message.command != self.number:
                raise ProtocolError("sequence_invalid",
                                    f"{message.type} for command {message.command} while "
                                    f"command {self.number} runs")
            if message.type == "result":
                self._check(self.started and not self.open, "result before its output ended")
                return Ending(message.body, self.captures[STDOUT], self.captures[STDERR])
            if message.type == "data":
                assert isinstance(message.body, bytes)
                self._check(self.started and message.stream in self.open,
                            "output outside its stream's life")
                self.captures[message.stream].take(message.body)
                yield Output(STREAM_NAMES[message.stream], message.body)
            else:
                self._control(message)
            self._tick()

    def abandon(self) -> None:
        """The caller stopped listening: cancel the command and wait for its result."""
        self.cancel_sent = True
        self.channel.send(Message("cancel", self.number))
        deadline = time.monotonic() + GRACE
        while (message := self.channel.receive(max(deadline - time.monotonic(), 0))) is not None:
            if message.command == self.number and message.type in ("result", "error"):
                return
        raise SessionError("agent_unresponsive", "the agent did not end a cancelled command")

    def _control(self, message: Message) -> None:
        if message.type == "error":
            self._check(not self.started, "a command error after its start")
            raise StartError(message.body["code"], message.body["message"][:200])
        if message.type == "started":
            self._check(not self.started, "a second started")
            self.started = True
            return
        self._check(self.started, f"{message.type} before started")
        if message.type == "eof":
            self._check(message.stream in self.open, "a second eof")
            self.open.discard(message.stream)
        elif message.type == "window":
            granted = message.body["bytes"]
            self._check(self.window + granted <= STDIN_WINDOW, "a window beyond what was sent")
            self.window += granted
            self._feed()
        else:
            raise ProtocolError("sequence_invalid", f"{message.type} during a command")

    def _feed(self) -> None:
        while self.input and self.window:
            size = min(CHUNK, self.window, len(self.input))
            self.channel.send(Message("data", self.number, body=bytes(self.input[:size])))
            self.input = self.input[size:]
            self.window -= size
        if not self.input and not self.eof_sent:
            self.channel.send(Message("eof", self.number))
            self.eof_sent = True

    def _step(self) -> float | None:
        steps = [CANCEL_POLL] if self.cancel is not None and not self.cancel_sent else []
        if self.give_up is not None:
            steps.append(max(self.give_up - time.monotonic(), 0))
        return min(steps) if steps else None

    def _tick(self) -> None:
        now = time.monotonic()
        if self.cancel is not None and self.cancel.is_set() and not self.cancel_sent:
            self.cancel_sent = True
            self.channel.send(Message("cancel", self.number))
            self.give_up = min(self.give_up or now + GRACE, now + GRACE)
        if self.give_up is not None and now >= self.give_up:
            raise SessionError("agent_unresponsive",
                               "the agent did not report the command's end in time")

    @staticmethod
    def _check(condition: bool, what: str) -> None:
        if not condition:
            raise ProtocolError("sequence_invalid", f"the agent sent {what}")
