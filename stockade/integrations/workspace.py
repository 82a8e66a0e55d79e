"""The one surface every integration adapts (MCP, pydantic-ai, the OpenAI Agents SDK,
deepagents, Inspect AI): a Workspace is a warm sandbox over one directory, with a policy fixed
when it is made, that runs commands and performs file operations inside the sandbox.

    >>> with Workspace(preset="workspace-write", workspace=path) as workspace:
    ...     workspace.write_file("hello.txt", b"hi\\n")
    ...     workspace.exec(["cat", "hello.txt"]).stdout
    'hi\\n'

What a caller cannot do through it: widen the policy (no call takes roots, network or limits;
a per-call timeout only shortens `limits.timeout`), reach a path outside the workspace with the
file operations (symbolic links are never followed), or run anything outside the sandbox.

Outcomes follow the shell's conventions, which the frameworks share: a command that is not
found exits 127, one that cannot be executed 126, one killed by signal N 128+N, and one that
outlived its timeout 124; a command that ends the sandbox itself (kill -9 -1) gets 137 and a
`sandbox.lost` denial, and the next call starts a new sandbox. Every violation carries the
grant that would have allowed it (`Denial.grant`), so a host application can build its own
approval flow; `denial_lines` (stockade/launch/denials.py) says the same in words, which every
integration puts in the tool result its model reads (a model sees no bare 124 or silently cut
output), and `stockade run` prints on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from stockade.errors import StartError, StockadeError, UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.denials import Denial, denial
from stockade.launch.manager import DEFAULT_OUTPUT_LIMIT
from stockade.launch.result import Result
from stockade.net.approve import (
    DEFAULT_TIMEOUT,
    DENY,
    Approval,
    Ask,
    on_loop,
)
from stockade.policy import Policy, resolve_policy
from stockade.session.errors import SessionError
from stockade.session.sandbox import Sandbox

FILEOP = os.path.join(os.path.dirname(os.path.realpath(__file__)), "fileop.py")
MAX_SANDBOXES = 8  # warm sandboxes one Workspace runs at once (for concurrent calls)
NOT_FOUND, NOT_EXECUTABLE, TIMED_OUT, KILLED = 127, 126, 124, 128 + 9
_START_CODES = {"command_not_found": NOT_FOUND, "command_not_executable": NOT_EXECUTABLE}


@dataclass(frozen=True)
class Outcome:
    """What one command did: its exit code (shell conventions), decoded output, violations."""

    exit_code: int
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    denials: tuple[Denial, ...] = ()

    @property
    def output(self) -> str:
        """stdout then stderr, as a terminal would show them one after the other."""
        return self.stdout + self.stderr

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Entry:
    """One directory entry: `kind` is file, directory, symlink or other; `mtime` its last
    modification (seconds since the epoch; of a link itself, not of its target)."""

    name: str
    kind: str
    size: int
    mtime: float


class FileError(StockadeError):
    """A file operation refused or failed. `code` is stable: not_found, not_a_directory,
    is_a_directory, not_a_regular_file, symlink_refused, outside_workspace,
    permission_denied, too_large, no_space, name_too_long, failed; `grant` as in Denial."""

    def __init__(self, code: str, message: str, grant: str | None = None) -> None:
        super().__init__(code, message)
        self.grant = grant


class Workspace:
    """A warm sandbox over `workspace` (default: the current directory) under `policy` (a
    Policy or a policy file) or `preset` (default "workspace-write").

    Calls may come from several threads at once: each runs in a warm sandbox of its own that
    no other call is using (at most `sandboxes`, default MAX_SANDBOXES; more wait), all over
    the same directory and policy. Sandboxes start on first use and again after one is lost
    (a command that kills its own agent); `close()` (or leaving the `with` block) kills
    everything in them.
    `keep_detached`: what a command detaches (setsid, a daemon) runs on in its sandbox until
    the Workspace closes (stockade.Sandbox's option); by default nothing outlives a command.

    `approvals` (network.mode "allowlist"): each call may bring an `approve` function of its
    own (`exec(..., approve=fn)`, as stockade.run's), which its sandbox's proxy asks about a
    destination network.allow leaves out while that call's command runs, bounded by
    `approve_timeout` seconds; allow-for-the-run lasts for that call. A call without one, or
    what runs between calls, is denied unasked; what a call left asked or waiting its turn is
    denied when it ends, never put to a later call. Not with `keep_detached` (a process a call
    left running would ask during a later one). (A host application asks its own user or
    client so: `stockade mcp --ask`.)"""

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None,
                 workspace: str | os.PathLike | None = None,
                 keep_detached: bool = False, sandboxes: int | None = None,
                 approvals: bool = False, approve_timeout: float = DEFAULT_TIMEOUT) -> None:
        if sandboxes is not None and sandboxes < 1:
            raise UsageError("a Workspace needs at least one sandbox (sandboxes >= 1)")
        if policy is None and preset is None:
            preset = "workspace-write"
        self.policy = resolve_policy(policy, preset)
        if self.policy.containment != "native":
            raise UsageError(f"a Workspace runs on the native containment, not "
                             f"{self.policy.containment!r} (use stockade.run or VmSandbox)")
        context = CompileContext.current(workspace)
        self.root = os.path.realpath(context.workspace)
        compiled = compile_policy(self.policy, ["true"], context)
        self.limits = compiled.limits
        self.env = dict(compiled.env)  # the closed environment every command starts with
        self.keep_detached = keep_detached
        if approvals and self.policy.network.mode != "allowlist":
            raise UsageError(f'approvals ask about what network.allow leaves out: they need '
                             f'network.mode "allowlist" (the policy\'s is '
                             f'"{self.policy.network.mode}")')
        if approvals and keep_detached:
            # (the proxy cannot tell a process an earlier call left running from the calling
            # command: its question would be put to a later call's approver, issue 34 W1)
            raise UsageError("approvals ask each call about its own command: they cannot be "
                             "had with keep_detached, whose processes outlive their call "
                             "(choose one)")
        self.approvals, self.approve_timeout = approvals, approve_timeout
        self._relays: dict[Sandbox, _Relay] = {}  # (approvals: each sandbox's, by sandbox)
        self._idle: list[Sandbox] = []
        self._started: list[Sandbox] = []
        self._pool = threading.Lock()
        # (MAX_SANDBOXES read now, not bound as the default: tests lower it module-wide)
        self._slots = threading.BoundedSemaphore(sandboxes or MAX_SANDBOXES)
        self._closed = False

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start a warm sandbox now, so the first call does not wait for it."""
        with self._sandbox():
            pass

    def close(self) -> None:
        with self._pool:
            self._closed = True
            started, self._started, self._idle = self._started, [], []
        for sandbox in started:
            sandbox.close()

    def timeout(self, requested: float | None) -> float | None:
        """The timeout a call runs under: the requested one, never longer than the policy's."""
        if requested is not None and requested <= 0:
            raise UsageError("timeout must be positive")
        limit = self.limits.timeout
        if requested is None:
            return limit
        return requested if limit is None else min(requested, limit)

    def own_timeout(self, requested: float | None) -> bool:
        """Whether a call asking for `requested` runs under its own timeout, shorter than the
        policy's `limits.timeout` (a timeout then is the call's, not the sandbox's limit)."""
        limit = self.limits.timeout
        return requested is not None and (limit is None or requested < limit)

    @contextlib.contextmanager
    def _sandbox(self, approve: Callable[[Ask], str] | None = None) -> Iterator[Sandbox]:
        """A warm sandbox no other call is using, for one call, whose proxy asks `approve`
        (approvals) while the call has it."""
        if approve is not None and not self.approvals:
            raise UsageError("approve= needs a Workspace made with approvals=True")
        with self._slots:
            with self._pool:
                if self._closed:
                    raise UsageError("this Workspace is closed")
                sandbox = self._idle.pop() if self._idle else None
            if sandbox is None or sandbox.closed:
                relay = _Relay() if self.approvals else None
                sandbox = Sandbox(self.policy, workspace=self.root,
                                  keep_detached=self.keep_detached, approve=relay)
                with self._pool:
                    self._started = [s for s in self._started if not s.closed] + [sandbox]
                    self._relays = {s: self._relays[s] for s in self._started
                                    if s in self._relays}
                    if relay is not None:
                        self._relays[sandbox] = relay
            relay = self._relays.get(sandbox)
            call = None if approve is None else Approval(approve, self.approve_timeout)
            if relay is not None:
                relay.call = call
            try:
                yield sandbox
            finally:
                if call is not None:  # (what the call left asked or waiting is denied, and
                    call.close()      # what asks after it, between calls: W2)
                with self._pool:
                    if not self._closed and not sandbox.closed:
                        self._idle.append(sandbox)

    def exec(self, command: Sequence[str] | str, *, shell: bool = False,
             cwd: str | os.PathLike | None = None, timeout: float | None = None,
             input: bytes | str | None = None, env: Mapping[str, str] | None = None,
             cancel: threading.Event | None = None,
             approve: Callable[[Ask], str] | None = None) -> Outcome:
        """Run `command` (an argv; a string only with `shell=True`, run by /bin/sh -c) in the
        sandbox. `cwd` is relative to the workspace (default: the workspace). `approve`
        (a Workspace with approvals): asked, while the command runs, about each destination
        network.allow leaves out (net/approve.py)."""
        argv = _argv(command, shell)
        data = input.encode() if isinstance(input, str) else input
        try:
            with self._sandbox(approve) as sandbox:
                result = sandbox.run(argv, input=data, timeout=self.timeout(timeout),
                                     cwd=self._cwd(cwd), env=env, cancel=cancel)
        except StartError as exc:
            if exc.code not in _START_CODES:
                raise
            return Outcome(_START_CODES[exc.code], "", exc.message + "\n", False, False)
        except SessionError as exc:
            if exc.code != "session_lost":
                raise
            # the command ended the sandbox's own agent (kill -9 -1): the sandbox died with
            # everything in it, and the next call starts a new one (denial_lines says so)
            return Outcome(KILLED, "", "", False, False,
                           (Denial("sandbox.lost", exc.message, None),))
        return outcome(result, self.own_timeout(timeout))

    async def aexec(self, command: Sequence[str] | str, *, shell: bool = False,
                    cwd: str | os.PathLike | None = None, timeout: float | None = None,
                    input: bytes | str | None = None, env: Mapping[str, str] | None = None,
                    cancel: threading.Event | None = None,
                    approve: Callable[[Ask], object] | None = None) -> Outcome:
        """`exec`, awaited (same arguments; `approve` may be an `async def`, awaited on the
        caller's loop) from asyncio or anyio, in a worker thread.
        Cancelling the awaiting task (a framework's cancellation, time limit or disconnect)
        kills the command's process tree, as setting `cancel` does, and waits until the
        command is over and its sandbox free for the next call before the cancellation goes
        on. (anyio is the frameworks' own: every one the integrations adapt brings it.)"""
        import anyio

        cancel = cancel or threading.Event()
        over = threading.Event()
        asked = None if approve is None else on_loop(approve)

        def run() -> Outcome:
            try:
                return self.exec(command, shell=shell, cwd=cwd, timeout=timeout, input=input,
                                 env=env, cancel=cancel, approve=asked)  # type: ignore[arg-type]
            finally:
                over.set()

        try:
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            cancel.set()
            with anyio.CancelScope(shield=True):  # (bounded: a cancelled command's end is)
                await anyio.to_thread.run_sync(over.wait)
            raise

    def read_file(self, path: str | os.PathLike, *, confined: bool = True,
                  limit: int | None = None) -> bytes:
        """The bytes of the file at `path` (relative to the workspace, or absolute in it;
        anywhere the sandbox can read it if not `confined`, still never through a link).
        A file of more than `limit` bytes (default: the policy's `limits.output`; a host
        application may take more, as Inspect's contract asks) is FileError `too_large`; one
        larger than `limits.output` is read in pieces of that size, each a command whose
        output stays within it (a file changing meanwhile may be read torn)."""
        piece = self.limits.output or DEFAULT_OUTPUT_LIMIT
        most = piece if limit is None else limit
        data = bytearray()
        while True:
            count = min(piece, most + 1 - len(data))
            try:
                read = self._fileop("read", path, confined=confined,
                                    arguments=(str(len(data)), str(count), str(most)))
                data += read
                if len(data) > most:  # (grown since its size was checked)
                    raise FileError("too_large", f"{self.resolve(path)}: more than {most} "
                                    "bytes")
            except FileError as exc:
                if exc.code != "too_large" or limit is not None:
                    raise
                raise FileError(exc.code, exc.message, "limits.output") from None
            if len(read) < count:
                return bytes(data)

    def write_file(self, path: str | os.PathLike, data: bytes | str, *,
                   confined: bool = True) -> None:
        """Write `data` to the file at `path`, making missing parent directories (outside the
        workspace too, where the sandbox can write, if not `confined`)."""
        self._fileop("write", path, data.encode() if isinstance(data, str) else data,
                      confined=confined)

    def remove_file(self, path: str | os.PathLike) -> None:
        """Remove the file (or the link itself) at `path`."""
        self._fileop("remove", path)

    def list_dir(self, path: str | os.PathLike = ".") -> list[Entry]:
        """The entries of the directory at `path`, sorted by name."""
        lines = self._fileop("list", path).decode().splitlines()
        return [Entry(**json.loads(line)) for line in lines]

    def exists(self, path: str | os.PathLike) -> bool:
        """Whether `path` names an entry (a link counts, and is not followed): the name looked
        up alone, however large its directory."""
        try:
            self._fileop("exists", path)
        except FileError as exc:
            if exc.code in ("not_found", "not_a_directory"):
                return False
            raise
        return True

    def resolve(self, path: str | os.PathLike) -> str:
        """`path` as an absolute path in the workspace (lexically: the file operations and
        the sandbox decide what it may reach)."""
        return os.path.normpath(os.path.join(self.root, os.fspath(path)))

    def _cwd(self, cwd: str | os.PathLike | None) -> str | None:
        return None if cwd is None else self.resolve(cwd)

    def _fileop(self, op: str, path: str | os.PathLike, data: bytes | None = None, *,
                confined: bool = True, arguments: Sequence[str] = ()) -> bytes:
        root = self.root if confined else "/"
        argv = [os.path.realpath(sys.executable), "-I", "-S", "-B", FILEOP, op, root,
                self.resolve(path), *arguments]
        result = None
        for attempt in range(2):  # a file operation is repeatable: once more on a new sandbox
            try:
                with self._sandbox() as sandbox:
                    result = sandbox.run(argv, input=data, timeout=self.timeout(None),
                                         cwd=self.root)
                break
            except SessionError as exc:
                if exc.code != "session_lost" or attempt:
                    raise
        assert result is not None
        if result.exit_code == 0 and not result.stdout_truncated:
            return bytes(result.stdout or b"")
        shown = self.resolve(path)
        if result.stdout_truncated:
            raise FileError("too_large", f"{shown}: larger than limits.output", "limits.output")
        try:
            failure = json.loads(result.stderr or b"")
            code, detail = failure["error"], failure["detail"]
        except (ValueError, KeyError, TypeError):
            raise FileError("failed", f"{shown}: the file operation ended with "
                            f"{result.returncode}") from None
        grant = f"filesystem.write {shown}" if op in ("write", "remove") and \
            code == "permission_denied" else None
        raise FileError(code, detail, grant)


class _Relay(Approval):
    """A warm sandbox's Approval (a Workspace with approvals): each question goes to the
    Approval of the call that had the sandbox when its connection arrived (captured then, not
    when its turn comes: a question of one call is never put to the next's approver, issue 34
    W2), which queues and bounds it, and denies it once that call has ended; with none
    (between calls, a call that brought no `approve`) the answer is a denial. What a call
    allows for the run lasts for that call: its Approval, which remembers it, is the call's."""

    def __init__(self) -> None:
        super().__init__(_unasked)
        self.call: Approval | None = None

    def answer(self, ask: Ask) -> str:
        call = self.call
        if call is None:
            return DENY
        return call.answer(ask)


def _unasked(ask: Ask) -> str:
    """A _Relay's own approver, never called: its `answer` routes every question."""
    return DENY


def read_only_policy(policy: Policy) -> Policy:
    """`policy` with nothing on the host writable (a framework's `read_only` option): its
    write roots read roots instead (the workspace stays readable), and no home of the
    sandbox's own (HOME is the host's, which no root then lets it write)."""
    fs = policy.filesystem
    return replace(policy, filesystem=replace(fs, read=tuple(dict.fromkeys(fs.read + fs.write)),
                                              write=(), home="host"))


def outcome(result: Result, timeout_by_call: bool = False) -> Outcome:
    """The Outcome of a Result: shell-style exit code, decoded output, denials with grants.
    `timeout_by_call`: the run's timeout was the call's own, shorter than `limits.timeout`
    (then no policy grant would have let the command run on)."""
    if result.timed_out:
        code = TIMED_OUT
    elif result.exit_code is None:
        code = 128 + (result.signal or 0)
    else:
        code = result.exit_code
    denials = (denial(violation) for violation in result.violations)
    return Outcome(code, _text(result.stdout), _text(result.stderr),
                   result.stdout_truncated or result.stderr_truncated, result.timed_out,
                   tuple(replace(d, grant=None) if d.kind == "limits.timeout" and timeout_by_call
                         else d for d in denials))


def _argv(command: Sequence[str] | str, shell: bool) -> list[str]:
    if isinstance(command, str):
        if not shell:
            raise UsageError("a command string needs shell=True (or give an argv list)")
        return ["/bin/sh", "-c", command]
    if shell:
        raise UsageError("shell=True takes a command string, not an argv list")
    argv = [os.fspath(word) for word in command]
    if not argv:
        raise UsageError("an empty command")
    return argv


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")
