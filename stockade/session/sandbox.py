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
from stockade.launch import calls, registry
from stockade.launch.compile import CompileContext, check_argv, compile_policy
from stockade.launch.env import close_environment
from stockade.launch.hostpaths import inside
from stockade.launch.manager import DEFAULT_OUTPUT_LIMIT, MERGE
from stockade.launch.pump import KEEP, Capture, Forward, Sink, capture_for
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation, network_denials
from stockade.net.approve import DEFAULT_TIMEOUT, Approval, Ask
from stockade.policy import Policy, merge, resolve_policy
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
SCRATCH = ("/tmp", "/dev/shm")  # the sandbox's own filesystems (namespaces), where cwd may lie


class Sandbox:
    """A warm sandbox. `policy` is a Policy or a policy file path; otherwise `preset` names one
    (default "read-only"); `workspace` is what `{workspace}` means. Closing it (or leaving the
    `with` block) kills everything in it; so does the owning process's death. Every process a
    command starts dies with it, unless `keep_detached`: then what a command detaches (a
    process in a session of its own: setsid, a daemon) runs on, in the sandbox, until the
    sandbox closes, when the command exits by itself (a timeout or cancel still kills it)."""

    def __new__(cls, policy: Policy | str | os.PathLike | None = None, *,
                preset: str | None = None, **kwargs: object) -> Sandbox:
        # A policy with `containment = "vm"` gets this host's VM driver, whoever constructs it
        # (the API, the daemon): it never runs in namespaces instead.
        if cls is Sandbox and resolve_policy(policy, preset).containment == "vm":
            cls = _vm_driver()
        return super().__new__(cls)

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, workspace: str | os.PathLike | None = None,
                 keep_detached: bool = False,
                 approve: Callable[[Ask], str] | Approval | None = None,
                 approve_timeout: float = DEFAULT_TIMEOUT) -> None:
        # (approve: as stockade.run's, for every command of the session; net/approve.py; an
        # Approval as it is, e.g. a Workspace's, which routes each question to its call's)
        self._approval = approve if isinstance(approve, Approval) or approve is None \
            else Approval(approve, approve_timeout)
        self._policy = resolve_policy(policy, preset)
        self.keep_detached = keep_detached  # fixed at boot: the agent is told in its hello
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
            return boot.boot(policy, ctx, keep_detached=self.keep_detached,
                             approval=self._approval)
        from stockade.launch.manager import with_changes

        request, self.changes = with_changes(boot.agent_request(policy, ctx))
        try:
            return boot.boot(policy, ctx, request=request, keep_detached=self.keep_detached,
                             approval=self._approval)
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
            self._session = boot.boot(self._policy, self._ctx, request=request,
                                      keep_detached=self.keep_detached)
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

    def run(self, args: calls.Args, *, input: bytes | str | None = None,
            stdin: calls.Destination = None, capture_output: bool | None = None,
            stdout: calls.Destination = calls.PIPE, stderr: calls.Destination = calls.PIPE,
            check: bool = False, text: bool | None = None, encoding: str | None = None,
            errors: str | None = None, universal_newlines: bool | None = None,
            env: Mapping[str, str | os.PathLike[str]] | None = None,
            timeout: float | str | None = None, shell: bool = False,
            cwd: str | os.PathLike | None = None,
            cancel: threading.Event | None = None) -> Result:
        """Run `args` in this sandbox and return its Result: the arguments of `stockade.run`
        that concern one command, meaning the same (output captured within `limits.output`,
        or sent where `stdout` and `stderr` say; `timeout` overrides `limits.timeout`; `env`
        adds variables to the policy's closed environment, refused names refused here too;
        setting `cancel` kills the command's process tree). `stdin` takes None, DEVNULL or
        PIPE, not a descriptor: the agent is sent `input` whole."""
        sinks = calls.sinks(capture_output, stdout, stderr)
        shape = calls.encoding(text, encoding, errors, universal_newlines)
        events = self._events(args, calls.stdin(stdin, input, shape, errors, relay=False),
                              env, timeout, shell, cwd, cancel)
        limit = self._output_limit()
        out = capture_for(sinks[0], limit)
        err = out if sinks[1] == MERGE else capture_for(sinks[1], limit)
        with contextlib.closing(events):
            for event in events:
                if isinstance(event, Result):
                    result = _delivered(event, sinks, out)
                else:
                    taker = out if event.stream == "stdout" else err
                    taker.take(event.data)
                    if isinstance(taker, Forward):
                        _written(taker)
        result = calls.shaped(result, args, shape, errors)
        if check:
            result.check_returncode()
        return result

    def stream(self, args: calls.Args, *, input: bytes | str | None = None,
               stdin: calls.Destination = None, text: bool | None = None,
               encoding: str | None = None, errors: str | None = None,
               universal_newlines: bool | None = None,
               env: Mapping[str, str | os.PathLike[str]] | None = None,
               timeout: float | str | None = None, shell: bool = False,
               cwd: str | os.PathLike | None = None,
               cancel: threading.Event | None = None) -> Iterator[Output | Result]:
        """Like `run`, but yields every Output chunk as it arrives (str in text mode, decoded
        as the Result's output is), then the Result (whose stdout/stderr are the same
        output, captured within `limits.output`). Leaving the loop early cancels the
        command. A mistake in the arguments raises at the call, before any iteration."""
        shape = calls.encoding(text, encoding, errors, universal_newlines)
        events = self._events(args, calls.stdin(stdin, input, shape, errors, relay=False),
                              env, timeout, shell, cwd, cancel)
        return _decoded(events, args, shape, errors)

    def _events(self, args: calls.Args, given: calls.Stdin,
                env: Mapping[str, str | os.PathLike[str]] | None, timeout: float | str | None,
                shell: bool, cwd: str | os.PathLike | None,
                cancel: threading.Event | None) -> Iterator[Output | Result]:
        """The command's output chunks as they arrive (bytes), then its Result. Every argument
        is checked before the generator is returned: a mistake raises at the call."""
        request = self._command(calls.argv(args, shell), cwd, calls.variables(env),
                                calls.seconds(timeout))
        cancel = calls.cancel_event(cancel)
        body = {"argv": list(request.argv), "cwd": request.cwd, "env": dict(request.env),
                "timeout": request.limits.timeout}
        if len(json.dumps(body)) > MAX_COMMAND:  # (refused here: the agent would end the session)
            raise UsageError(f"the command, its directory and environment take more than "
                             f"{MAX_COMMAND >> 10} KiB: pass large data through input or a file")
        return self._exchange(request, body, given.data, self._output_limit(), cancel)

    def _exchange(self, request: LaunchRequest, body: dict, input: bytes | None, limit: int,
                  cancel: threading.Event | None) -> Iterator[Output | Result]:
        with self._turn():
            self._number += 1
            exchange = Exchange(self._session.channel, self._number, input, limit,
                                request.limits.timeout, cancel)
            began = time.monotonic()
            seen = len(self._network_records())
            self._refusals()  # (what came between commands is no command's)
            try:
                ending = yield from exchange.run(body)
            except GeneratorExit:
                if self._closed is None:  # (a closed sandbox has nothing left to cancel)
                    self._guard(exchange.abandon)
                raise
            except (ProtocolError, SessionError) as exc:
                raise self._lose(exc) from None
            # (commands take turns: the proxy's records since this one began are its own, and
            # so are the sandbox's refusals, each reported before the refused call returned)
            records = self._network_records()[seen:]
            refused = self._refusals()
        yield self._result(request, ending, time.monotonic() - began, records, refused)

    def _output_limit(self) -> int:
        limit = self._session.request.limits.output  # (every command's: see _command)
        return DEFAULT_OUTPUT_LIMIT if limit is None else limit

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
                 env: Mapping[str, str], timeout: float | None) -> LaunchRequest:
        """The LaunchRequest this command amounts to: the session's roots, network and limits
        with the command's own argv, cwd, environment and timeout (hence its own digest)."""
        scratch = None if cwd is None else self._scratch(cwd)
        if cwd is None or scratch is not None:  # (the common case resolves no root again)
            check_argv(argv)
            own = replace(self._default, argv=tuple(argv), cwd=scratch or self._default.cwd)
        else:
            own = compile_policy(self._policy, list(argv), self._ctx, cwd=cwd)
        variables = dict(own.env)
        if env:  # names and values checked as the policy's env.set (the agent takes no other)
            merge(self._policy, {"env": {"set": env}}, file="env=")
            variables |= dict(close_environment((), tuple(env.items()), {}))
        session = self._session.request
        return replace(session, argv=own.argv, cwd=own.cwd, env=tuple(sorted(variables.items())),
                       limits=replace(session.limits, timeout=own.limits.timeout
                                      if timeout is None else timeout),
                       request_id=secrets.token_hex(16))

    def _scratch(self, cwd: str | os.PathLike) -> str | None:
        """`cwd` (normalised) if it lies in the sandbox's own /tmp or /dev/shm, fresh
        filesystems the host cannot look into: the agent's chdir then decides (a missing one
        is StartError `cwd_invalid`). None where the host decides: any other path, one in a
        root mounted there (or /tmp itself a root), and in the landlock tier (no own /tmp)."""
        path = os.fspath(cwd) if isinstance(cwd, str | os.PathLike) else None
        if not isinstance(path, str) or "\0" in path or not os.path.isabs(path) or \
                self.containment != "linux" or self._policy.isolation == "landlock":
            return None  # (compile_policy checks it, or refuses it)
        path = os.path.normpath(path)
        session = self._session.request  # (its roots: the policy's and the agent's own)
        roots = [grant.path for grant in session.read + session.write]
        for own in SCRATCH:
            if inside(path, own):
                held = any(inside(root, own) and inside(path, root) for root in roots)
                return None if held else path
        return None

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

    def _refusals(self) -> list[Violation]:
        """What the sandbox refused since the last call (Handle.refusals)."""
        return self._session.handle.refusals()

    def _result(self, request: LaunchRequest, ending: Ending, duration: float,
                records: list[dict], refused: list[Violation]) -> Result:
        body = ending.result
        violations = []
        if body["timed_out"]:
            violations.append(Violation("limits.timeout",
                                        f"killed after {request.limits.timeout:g}s"))
        if body["cancelled"]:
            violations.append(Violation("cancelled", "cancelled by the caller"))
        violations += network_denials(records) + refused
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


def _decoded(events: Iterator[Output | Result], args: calls.Args, shape: str | None,
             errors: str | None) -> Iterator[Output | Result]:
    """`events` with the output decoded in text mode (`shape`: its encoding) and the Result
    shaped as the caller asked."""
    decoders = {name: _decoder(shape, errors) for name in ("stdout", "stderr")}
    with contextlib.closing(events):  # (left early: the command is cancelled now)
        for event in events:
            if isinstance(event, Result):
                for name, decode in decoders.items():  # (what a decoder held back)
                    if tail := decode(b"", final=True):
                        yield Output(name, tail)  # type: ignore[arg-type]
                yield calls.shaped(event, args, shape, errors)
            elif shape is None:
                yield event
            elif chunk := decoders[event.stream](event.data):
                yield Output(event.stream, chunk)  # type: ignore[arg-type]


def _delivered(result: Result, sinks: tuple[Sink, Sink], out: Capture) -> Result:
    """`result` with only the output that was to be captured (stderr=STDOUT: both streams,
    in the order they arrived, as stdout)."""
    merged = sinks[1] == MERGE
    stdout = result.stdout if sinks[0] == KEEP else None
    if merged and sinks[0] == KEEP:
        return replace(result, stdout=bytes(out.data), stdout_truncated=out.truncated,
                       stderr=None)
    return replace(result, stdout=stdout,
                   stderr=result.stderr if sinks[1] == KEEP else None)


def _written(forward: Forward) -> None:
    """What `forward` holds, written to its descriptor now (it may block while the
    descriptor's reader catches up)."""
    while forward.pending and not forward.closed:
        forward.flush_some(len(forward.pending))


def _decoder(encoding: str | None, errors: str | None) -> Callable[..., str]:
    """Decodes one stream's chunks as they come, as the Result's output is decoded (universal
    newlines, a character or a CRLF split between chunks included)."""
    if encoding is None:
        return lambda data, final=False: ""
    import codecs
    import io

    decoder = io.IncrementalNewlineDecoder(
        codecs.getincrementaldecoder(encoding)(errors or "strict"), translate=True)

    def decode(data: bytes, final: bool = False) -> str:
        try:
            return decoder.decode(data, final=final)
        except UnicodeDecodeError as exc:
            raise UsageError(f"output is not {encoding} text ({exc.reason}): pass "
                             "errors='replace', or read bytes (no text=)") from None

    return decode


def _vm_driver() -> type[Sandbox]:
    """The warm sandbox of this host's VM driver, the one the manager would choose for
    containment "vm" (registry.py: Windows Sandbox on Windows, QEMU on Linux)."""
    drivers = registry.here(registry.VM)
    if not drivers:
        raise UnavailableError("backend_unavailable", 'no VM driver for containment = "vm" '
                               f"runs on this host ({sys.platform})")
    return registry.create(drivers[0]).sandbox  # type: ignore[attr-defined]
