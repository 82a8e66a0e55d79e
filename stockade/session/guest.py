"""Containment "vm" as a backend like any other: each request runs as the one command of a
fresh guest, booted for it and ended with it, so that the manager chooses a VM driver as it
chooses a native backend (launch/registry.py) and `execute` drives it the same way: output
relayed or captured within `limits.output`, the timeout and a cancel ending the guest.

A driver (vm/qemu.py, vm/wsb.py) subclasses `GuestBackend`: `plan` refuses, typed, what its
guest cannot enforce; `boot` starts a guest whose agent runs the agent's launch
(session/boot.py `agent_launch`) and has said hello. The handle's thread reads the command's
stdin whole (a guest's command is given its input up front), boots, runs the command over the
session protocol, and writes its output into the pipes the caller reads.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING

from stockade.errors import StockadeError, UsageError
from stockade.launch.backend import (
    Backend,
    Capability,
    Exit,
    Handle,
    Stdio,
    refuse_other_containment,
)
from stockade.launch.request import LaunchRequest
from stockade.launch.result import network_denials
from stockade.session import boot
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.exchange import Exchange
from stockade.session.protocol import Message

if TYPE_CHECKING:
    from stockade.session.sandbox import Sandbox

MAX_INPUT = 64 << 20  # bytes of stdin a guest's command may be given (it is held in memory)
KILLED = getattr(signal, "SIGKILL", 9)  # how a killed launch ends, as on Linux
SHUTDOWN_GRACE = 1.0  # seconds a guest may take to end by itself after its command


class GuestBackend(Backend):
    """A VM driver's backend (see the module docstring)."""

    mechanism = ""  # what holds the command, for the report
    sandbox: type[Sandbox]  # the driver's warm sandbox (stockade.Sandbox for containment vm)

    @abc.abstractmethod
    def plan(self, agent: LaunchRequest) -> None:
        """Raise UnenforceableError for what a guest cannot enforce of the agent's launch."""

    @abc.abstractmethod
    def boot(self, agent: LaunchRequest) -> boot.Session:
        """A guest running the agent's launch `agent`, whose agent has said hello."""

    def command_env(self, request: LaunchRequest, session: boot.Session) -> dict[str, str]:
        """The command's environment inside the guest `session`."""
        return dict(request.env)

    def denials(self, session: boot.Session) -> list[dict]:
        """The egress proxy's decision records for the guest, once the command has ended."""
        return []

    def end(self, session: boot.Session, *, killed: bool, reusable: bool) -> None:
        """The command is over: let the guest end by itself (its agent exits on `shutdown`),
        else kill it. (A driver that keeps its guest for the next launch hands it back
        instead; `reusable`: the command ended and the session is sound.)"""
        if not killed:
            with contextlib.suppress(OSError, SessionError):
                session.channel.send(Message("shutdown"))
            session.handle.wait(SHUTDOWN_GRACE)
        session.handle.kill()
        session.channel.close()

    def check(self, request: LaunchRequest) -> None:
        refuse_other_containment(request, self.name, "vm")
        self.plan(boot.agent_launch(request))

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> GuestHandle:
        return GuestHandle(self, request, stdio)

    def report(self) -> list[Capability]:
        return [Capability("containment.vm", True, self.mechanism)]


class GuestHandle(Handle):
    """One command in a guest of its own (see the module docstring)."""

    def __init__(self, backend: GuestBackend, request: LaunchRequest, stdio: Stdio) -> None:
        self.backend, self.request = backend, request
        self.enforced, self.violations, self.network_log = {}, [], []
        self.stages = [("spawn", time.monotonic())]
        self.pid = 0
        self._session: boot.Session | None = None
        self._killed = threading.Event()
        self._exit: Exit | None = None
        self._stdin: int | None = None
        if stdio.stdin == subprocess.PIPE:  # what the caller writes is the input
            self._stdin, writer = os.pipe()
            self.stdin = _stream(writer, "wb")
        out_read, self._out = os.pipe()
        self.stdout = _stream(out_read, "rb")
        if stdio.stderr == subprocess.STDOUT:  # merged into stdout, as subprocess.STDOUT
            self._err, self.stderr = self._out, None
        else:
            err_read, self._err = os.pipe()
            self.stderr = _stream(err_read, "rb")
        self._thread = threading.Thread(target=self._run, name="stockade-guest", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> Exit | None:
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self._exit

    def kill(self) -> None:
        self._killed.set()
        session = self._session
        if session is not None:
            session.handle.kill()

    def _run(self) -> None:
        reusable = False
        try:
            self._exit = self._command(self._input())
            reusable = not self._killed.is_set()
        except (StockadeError, ProtocolError, OSError) as exc:
            self._exit = (Exit(None, KILLED) if self._killed.is_set()
                          else Exit(None, None, failure=exc))
        finally:
            if self._session is not None:
                self._end(self._session, reusable)
            for fd in {self._out, self._err}:
                os.close(fd)
            self.stages.append(("command", time.monotonic()))

    def _end(self, session: boot.Session, reusable: bool) -> None:
        self.network_log = self.backend.denials(session)  # (before a kept guest is lent again)
        self.backend.end(session, killed=self._killed.is_set(), reusable=reusable)
        self.violations = network_denials(self.network_log)

    def _input(self) -> bytes | None:
        if self._stdin is None:
            return None
        with os.fdopen(self._stdin, "rb") as source:
            data = source.read(MAX_INPUT + 1)
        if len(data) > MAX_INPUT:
            raise UsageError(f"stdin is larger than {MAX_INPUT} bytes, the most a command in "
                             "a VM guest is given")
        return data

    def _command(self, data: bytes | None) -> Exit:
        if self._killed.is_set():
            return Exit(None, KILLED)
        self._session = session = self.backend.boot(boot.agent_launch(self.request))
        if self._killed.is_set():  # (killed while it booted)
            session.handle.kill()
        self.pid = session.handle.pid
        self.stages.append(("boot", time.monotonic()))
        hello = session.hello
        self.enforced = {"sandbox": self.backend.name, "agent": hello["agent"],
                         "observed_in_sandbox": hello["observed"]}
        body = {"argv": list(self.request.argv), "cwd": self.request.cwd,
                "env": self.backend.command_env(self.request, session), "timeout": None}
        session.commands += 1  # (a kept guest's agent has seen earlier launches' numbers)
        exchange = Exchange(session.channel, session.commands, data, 0, None,
                            None)  # (nothing captured: the pipes carry the output)
        commanding = exchange.run(body)
        try:
            while True:
                event = next(commanding)
                _write_all(self._out if event.stream == "stdout" else self._err, event.data)
        except StopIteration as done:
            ending = done.value
        except SessionError:
            if self._killed.is_set():
                return Exit(None, KILLED)
            raise
        result = ending.result
        return Exit(result["exit_code"], result["signal"])


def _stream(fd: int, mode: str) -> IO[bytes]:
    return os.fdopen(fd, mode, buffering=0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(BrokenPipeError):  # the caller stopped reading: its business
        while view:
            view = view[os.write(fd, view):]
