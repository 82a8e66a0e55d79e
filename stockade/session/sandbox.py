"""`stockade.Sandbox`: one warm sandbox that runs many commands, one at a time.

    >>> with stockade.Sandbox(preset="workspace-write", workspace="proj") as sb:
    ...     sb.run(["make"]).exit_code
    ...     for event in sb.stream(["make", "test"]):
    ...         print(event)          # Output chunks as they arrive, then the Result

Every command runs inside the same sandbox (same roots, network, limits), as a child of the
guest agent; commands of one Sandbox share one trust domain (see docs/sessions.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from stockade.errors import UnavailableError, UsageError
from stockade.launch import registry
from stockade.launch.compile import CompileContext, check_argv, compile_policy
from stockade.launch.env import close_environment
from stockade.launch.manager import DEFAULT_OUTPUT_LIMIT
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation, network_denials
from stockade.policy import Policy, resolve_policy
from stockade.session import boot
from stockade.session.errors import ProtocolError, SessionError
from stockade.session.exchange import Ending, Exchange, Output
from stockade.session.protocol import MAX_FRAME, Message

if TYPE_CHECKING:
    from stockade.lifecycle.changes import ChangeSet

T = TypeVar("T")
BACKEND = "linux-session"
CLOSE_GRACE = 1.0  # seconds an idle agent may take to exit after `shutdown`
MAX_COMMAND = MAX_FRAME - (4 << 10)  # encoded bytes of one command (its frame's envelope aside)


class Sandbox:
    """A warm sandbox. `policy` is a Policy or a policy file path; otherwise `preset` names one
    (default "read-only"); `workspace` is what `{workspace}` means. Closing it (or leaving the
    `with` block) kills everything in it; so does the owning process's death."""

    def __new__(cls, policy: Policy | str | os.PathLike | None = None, *,
                preset: str | None = None, **kwargs: object) -> Sandbox:
        # A policy with `containment = "vm"` gets this host's VM driver, whoever constructs it
        # (the API, the daemon): it never runs in namespaces instead.
        if cls is Sandbox and resolve_policy(policy, preset).containment == "vm":
            cls = _vm_driver()
        return super().__new__(cls)

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, workspace: str | os.PathLike | None = None) -> None:
        self._policy = resolve_policy(policy, preset)
        self._ctx = CompileContext.current(workspace)
        self._default = compile_policy(self._policy, ["true"], self._ctx)  # cwd, env, limits
        # filesystem.workspace = "overlay": one change set for the session's life, pending
        # after it (`changes`); `checkpoint` and `rollback` copy its upper layers.
        self.changes: ChangeSet | None = None
        self._session = self._boot(self._policy, self._ctx)
        weakref.finalize(self, self._session.handle.kill)
        self._lock = threading.Lock()  # held by the command that uses the channel
        self._ending = threading.Lock()  # held while the sandbox is being ended
        self._ended = False
        self._owner: int | None = None
        self._number = 0
        self._closed: SessionError | None = None
        hello = self._session.hello
        self.enforced: dict = {"sandbox": self.containment, "agent": hello["agent"],
                               "observed_in_sandbox": hello["observed"]}

    containment = "linux"  # what holds the agent (a subclass boots something else)

    def _boot(self, policy: Policy, ctx: CompileContext) -> boot.Session:
        """Start the agent in its sandbox and greet it (an overlaid workspace's layers made
        first, in a change set of the session's own)."""
        if policy.filesystem.workspace != "overlay":
            return boot.boot(policy, ctx)
        from stockade.launch.manager import with_changes

        request, self.changes = with_changes(boot.agent_request(policy, ctx))
        try:
            return boot.boot(policy, ctx, request=request)
        except BaseException:
            self.changes.finish(None)
            self.changes.discard()
            raise

    def checkpoint(self) -> str:
        """Copy what the commands have changed so far (filesystem.workspace = "overlay"), for
        `rollback`; returns the checkpoint's name. Taken between commands: what a command
        left running in the background may still be writing."""
        changes = self._overlaid()
        with self._turn():
            return changes.checkpoint()

    def rollback(self, checkpoint: str) -> None:
        """Return the workspace, as the sandbox sees it, to `checkpoint`: the sandbox is
        restarted (everything running in it ends) over the changes as they were then."""
        changes = self._overlaid()
        with self._turn():
            with contextlib.suppress(OSError):
                self._session.channel.send(Message("shutdown"))
            self._end(CLOSE_GRACE)
            self._session.channel.close()
            changes.rollback(checkpoint)
            request = replace(self._session.request, request_id=secrets.token_hex(16))
            self._session = boot.boot(self._policy, self._ctx, request=request)
            self._ended = False
            weakref.finalize(self, self._session.handle.kill)

    def _overlaid(self) -> ChangeSet:
        if self.changes is None:
            raise UsageError('checkpoint and rollback need filesystem.workspace = "overlay"')
        return self.changes

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, argv: Sequence[str], *, input: bytes | None = None,
            timeout: float | None = None, cwd: str | os.PathLike | None = None,
            env: Mapping[str, str] | None = None,
            cancel: threading.Event | None = None) -> Result:
        """Run `argv` in this sandbox and return its Result (output captured within
        `limits.output`). `timeout` (seconds) overrides `limits.timeout`; `env` adds variables
        to the policy's closed environment (refused names are refused here too); setting
        `cancel` kills the command's process tree."""
        result = None
        for event in self.stream(argv, input=input, timeout=timeout, cwd=cwd, env=env,
                                 cancel=cancel):
            result = event
        assert isinstance(result, Result)
        return result

    def stream(self, argv: Sequence[str], *, input: bytes | None = None,
               timeout: float | None = None, cwd: str | os.PathLike | None = None,
               env: Mapping[str, str] | None = None,
               cancel: threading.Event | None = None) -> Iterator[Output | Result]:
        """Like `run`, but yields every Output chunk as it arrives, then the Result (whose
        stdout/stderr are the same bytes, captured within `limits.output`). Leaving the loop
        early cancels the command."""
        request = self._command(argv, cwd, env, timeout)
        limit = request.limits.output
        limit = DEFAULT_OUTPUT_LIMIT if limit is None else limit
        body = {"argv": list(request.argv), "cwd": request.cwd, "env": dict(request.env),
                "timeout": request.limits.timeout}
        if len(json.dumps(body)) > MAX_COMMAND:  # (refused here: the agent would end the session)
            raise UsageError(f"the command, its directory and environment take more than "
                             f"{MAX_COMMAND >> 10} KiB: pass large data through input or a file")
        with self._turn():
            self._number += 1
            exchange = Exchange(self._session.channel, self._number, input, limit,
                                request.limits.timeout, cancel)
            began = time.monotonic()
            seen = len(self._network_records())
            try:
                ending = yield from exchange.run(body)
            except GeneratorExit:
                if self._closed is None:  # (a closed sandbox has nothing left to cancel)
                    self._guard(exchange.abandon)
                raise
            except (ProtocolError, SessionError) as exc:
                raise self._lose(exc) from None
            # (commands take turns: the proxy's records since this one began are its own)
            records = self._network_records()[seen:]
        yield self._result(request, ending, time.monotonic() - began, records)

    def ping(self, timeout: float = 5.0) -> float:
        """Seconds for a round trip to the agent (SessionError if it does not answer)."""
        with self._turn():
            seq = secrets.randbits(31)
            began = time.monotonic()
            self._session.channel.send(Message("ping", body={"seq": seq}))
            reply = self._guard(lambda: self._session.channel.receive(timeout))
            if reply is None or reply.type != "pong" or reply.body["seq"] != seq:
                raise self._lose(SessionError("agent_unresponsive",
                                              "the agent did not answer a ping"))
            return time.monotonic() - began

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def pid(self) -> int:
        """The host pid of what holds the agent: the sandbox's init, or the VM's process."""
        return self._session.handle.pid

    @property
    def request_id(self) -> str:
        """The id of the agent's own launch (the session's ledger record is named by it)."""
        return self._session.request.request_id

    def close(self) -> None:
        """Kill the sandbox and everything in it (idempotent). A command running on another
        thread ends with SessionError `session_closed`."""
        if self._closed is not None:
            return
        self._closed = SessionError("session_closed", "the Sandbox was closed")
        if self._lock.acquire(blocking=False):
            try:
                with contextlib.suppress(OSError):
                    self._session.channel.send(Message("shutdown"))
                self._end(CLOSE_GRACE)
                self._session.channel.close()
            finally:
                self._lock.release()
        else:  # a command holds the channel: it sees the session end and closes the channel
            self._end()
        if self.changes is not None:  # (kept pending: stockade changes, apply, discard)
            self.changes.finish(None)

    # --- internals ---------------------------------------------------------------------------

    def _command(self, argv: Sequence[str], cwd: str | os.PathLike | None,
                 env: Mapping[str, str] | None, timeout: float | None) -> LaunchRequest:
        """The LaunchRequest this command amounts to: the session's roots, network and limits
        with the command's own argv, cwd, environment and timeout (hence its own digest)."""
        if timeout is not None and timeout <= 0:
            raise UsageError("timeout must be positive")
        if cwd is None:  # the common case skips resolving every root again
            check_argv(argv)
            own = replace(self._default, argv=tuple(argv))
        else:
            own = compile_policy(self._policy, list(argv), self._ctx, cwd=cwd)
        variables = dict(own.env)
        if env:
            variables |= dict(close_environment((), tuple(env.items()), {}))
        session = self._session.request
        return replace(session, argv=own.argv, cwd=own.cwd, env=tuple(sorted(variables.items())),
                       limits=replace(session.limits, timeout=own.limits.timeout
                                      if timeout is None else timeout),
                       request_id=secrets.token_hex(16))

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        if self._owner == threading.get_ident():
            raise UsageError("this thread is already running a command in this Sandbox "
                             "(finish or close its stream first)")
        with self._lock:
            if self._closed is not None:
                raise self._closed
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None
                if self._closed is not None:
                    self._session.channel.close()

    def _guard(self, step: Callable[[], T]) -> T:
        try:
            return step()
        except (ProtocolError, SessionError) as exc:
            raise self._lose(exc) from None

    def _lose(self, exc: ProtocolError | SessionError) -> Exception:
        """The session is unusable: end the sandbox. Returns what to raise: `exc`, or
        `session_closed` when close() ended it; later calls raise `session_lost`."""
        closed = self._closed
        if closed is None:
            self._closed = SessionError("session_lost", f"the session was lost ({exc})")
        self._end()
        return closed or exc

    def _end(self, grace: float = 0) -> None:
        """Wait up to `grace` seconds for the sandbox to end by itself, then kill it; once."""
        with self._ending:
            if not self._ended:
                handle = self._session.handle
                if not grace or handle.wait(grace) is None:
                    handle.kill()
                    handle.wait()
                self._ended = True

    def _network_records(self) -> list[dict]:
        """The egress proxy's records so far for this sandbox (none without a proxy)."""
        return self._session.handle.network_records()

    def _result(self, request: LaunchRequest, ending: Ending, duration: float,
                records: list[dict]) -> Result:
        body = ending.result
        violations = []
        if body["timed_out"]:
            violations.append(Violation("limits.timeout",
                                        f"killed after {request.limits.timeout:g}s"))
        if body["cancelled"]:
            violations.append(Violation("cancelled", "cancelled by the caller"))
        violations += network_denials(records)
        for name, capture in (("stdout", ending.stdout), ("stderr", ending.stderr)):
            if capture.truncated:
                violations.append(Violation("limits.output",
                                            f"{name} cut at {capture.limit} bytes"))
        start, wall = body["start"] * 1000, body["wall"] * 1000
        return Result(
            exit_code=body["exit_code"], signal=body["signal"],
            stdout=bytes(ending.stdout.data), stderr=bytes(ending.stderr.data),
            stdout_truncated=ending.stdout.truncated, stderr_truncated=ending.stderr.truncated,
            timed_out=body["timed_out"], cancelled=body["cancelled"], duration=duration,
            backend=BACKEND, digest=request.digest, request_id=request.request_id,
            violations=tuple(violations), enforced=self.enforced, network_log=tuple(records),
            timings={"start": round(start, 3), "run": round(wall, 3),
                     "session": round(max(duration * 1000 - start - wall, 0), 3)},
            args=list(request.argv), timeout=request.limits.timeout,
        )


def _vm_driver() -> type[Sandbox]:
    """The warm sandbox of this host's VM driver, the one the manager would choose for
    containment "vm" (registry.py: Windows Sandbox on Windows, QEMU on Linux)."""
    drivers = registry.here(registry.VM)
    if not drivers:
        raise UnavailableError("backend_unavailable", 'no VM driver for containment = "vm" '
                               f"runs on this host ({sys.platform})")
    return registry.create(drivers[0]).sandbox  # type: ignore[attr-defined]
