"""SandboxManager: picks a backend and runs a LaunchRequest in it. It never runs a command
unsandboxed; `run_unsandboxed` is the one, separately named, way to do that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from stockade.errors import UnavailableError, UnenforceableError, UsageError
from stockade.launch import registry
from stockade.launch.backend import Backend, Stdio
from stockade.launch.pump import DISCARD, KEEP, Forward, Outcome, Sink, drive
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.policy.model import Policy

if TYPE_CHECKING:
    from stockade.lifecycle.changes import ChangeSet
    from stockade.net.approve import Approval

MODES = ("require", "auto")
DEFAULT_OUTPUT_LIMIT = 16 << 20
MERGE = "merge"  # `execute`'s stderr: the command's stderr is its stdout, as subprocess.STDOUT


class SandboxManager:
    """Chooses the backend: `require` a named one, or `auto` the best that runs on this host
    and can enforce the whole request, among those registered (registry.py) for the request's
    containment. Neither ever falls back to running on the host."""

    def __init__(self, backend: str | None = None, mode: str = "auto") -> None:
        if mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}")
        if mode == "require" and not backend:
            raise UsageError("mode 'require' needs a backend name")
        if backend:
            registry.entry(backend)  # UnavailableError for an unknown name
        self.mode = mode
        self.wanted = backend

    def select(self, request: LaunchRequest) -> Backend:
        """The backend that will run `request`, or the typed reason none can (the reason of
        the best backend, when several refuse). A native backend must also pass its readiness
        probe (a real launch that also reconciles the ledger), cached per process; a guest's
        readiness is its own boot, once per launch (the agent answers from inside it)."""
        from stockade.launch.probe import require_ready

        if self.wanted:
            wanted = registry.entry(self.wanted)
            if wanted.containment != request.containment:
                raise UsageError(f"backend {self.wanted!r} provides containment "
                                 f"{wanted.containment!r}; the policy asks for containment = "
                                 f'"{request.containment}"')
            candidates = [wanted]
        else:  # (another platform's backend is never tried: it could not even be imported)
            candidates = registry.here(request.containment)
        refusals: list[UnavailableError | UnenforceableError] = []
        for candidate in candidates:
            try:
                backend = isolated(registry.create(candidate), request.isolation)
                backend.probe()
                backend.check(request)
                if request.workspace == "overlay" and not backend.overlay_workspace:
                    raise UnenforceableError("filesystem.workspace", f"the {backend.name} "
                                             "backend cannot give a copy-on-write workspace")
                if candidate.containment == registry.NATIVE:
                    require_ready(backend)
                return backend
            except (UnavailableError, UnenforceableError) as exc:
                refusals.append(exc)
        if refusals:
            raise refusals[0]
        raise UnavailableError("backend_unavailable", f"no backend for containment "
                               f'"{request.containment}" runs on this host ({sys.platform})')

    def run(self, request: LaunchRequest, *, input: bytes | None = None,
            stdio_inherit: bool = False, cancel: threading.Event | None = None,
            stdout: Sink = KEEP, stderr: Sink = KEEP, stdin_from: int = 0,
            approval: Approval | None = None) -> Result:
        """Run `request` to completion, capturing output within `limits.output` (see
        `execute` for the output's other destinations, and stdin's source). With `approval`,
        the allowlist proxy asks it about destinations outside network.allow."""
        backend = self.select(request)
        if approval is not None:
            if request.network.mode != "allowlist":
                raise UsageError(f"approve= asks about what network.allow leaves out: it needs "
                                 f'network.mode "allowlist" (the policy\'s is '
                                 f'"{request.network.mode}")')
            if not hasattr(backend, "with_approval"):
                raise UnenforceableError("network.approve", f"the {backend.name} backend "
                                         "cannot ask about a destination while it runs")
            backend = backend.with_approval(approval)
        return execute(backend, request, input=input, stdio_inherit=stdio_inherit,
                       cancel=cancel, stdout=stdout, stderr=stderr, stdin_from=stdin_from)


def isolated(backend: Backend, isolation: str) -> Backend:
    """The backend's tier an isolation names (a request's `isolation`): chosen only by the
    request, never as a fallback."""
    if isolation == "namespaces":
        return backend
    tier = getattr(backend, "tier", None)
    if tier is None:
        raise UnenforceableError("isolation", f"the {backend.name} backend has no "
                                 f"{isolation} isolation")
    return tier(isolation)


def execute(backend: Backend, request: LaunchRequest, *, input: bytes | None = None,
            stdio_inherit: bool = False, cancel: threading.Event | None = None,
            stdout: Sink = KEEP, stderr: Sink = KEEP, stdin_from: int = 0) -> Result:
    """Spawn in `backend`, feed `input` (or relay this process's descriptor `stdin_from`, its
    stdin by default, if the request inherits it), capture bounded output (or relay it to
    this process's stdout and stderr, `stdio_inherit`; or send each where `stdout` and
    `stderr` say: pump.KEEP, pump.DISCARD, a descriptor of this process, and for stderr
    MERGE, into the command's stdout), enforce the timeout; setting `cancel` kills the whole
    sandbox tree. Output not kept is None in the Result."""
    weaken = getattr(backend, "weaken", frozenset())  # (tests only: see frame.LAYERS)
    limit = request.limits.output if request.limits.output is not None else DEFAULT_OUTPUT_LIMIT
    if "output_cap" in weaken:
        limit = sys.maxsize
    if stdio_inherit:
        stdout, stderr = 1, 2
    passed = input is None and request.stdin == "inherit"
    stdin: int | None = subprocess.PIPE if input is not None or passed else subprocess.DEVNULL
    out: int | None = subprocess.PIPE
    err: int | None = subprocess.STDOUT if stderr == MERGE else subprocess.PIPE
    # Every stream is a pipe this process relays: no descriptor of the caller's (a terminal,
    # an appended file) enters the sandbox, and the output limit holds on the way through.
    # (The "stdio_relay" weakening, tests only, hands the caller's own descriptors instead.)
    if "stdio_relay" in weaken:
        if passed:
            stdin, passed = None, False
        if stdio_inherit:
            out = err = None
    started = time.monotonic()
    request, changes = _overlaid(backend, request)
    try:
        handle = backend.spawn(request, Stdio(stdin, out, err))
        timeout = None if "timeout" in weaken else request.limits.timeout
        done = drive(handle, input=input, limit=limit, timeout=timeout, cancel=cancel,
                     outputs=(stdout, DISCARD if stderr == MERGE else stderr),
                     stdin_from=stdin_from if passed else None)
    except BaseException:
        _settled(changes, None)
        raise
    changes = _settled(changes, done.end.exit_code)
    if done.end.failure is not None:
        raise done.end.failure
    violations = []
    if done.timed_out:
        violations.append(Violation("limits.timeout", f"killed after {timeout:g}s"))
    if done.cancelled:
        violations.append(Violation("cancelled", "cancelled by the caller"))
    violations += handle.violations
    home = _home_unwritable(request, done)
    if home is not None:
        violations.append(home)
    for name, capture in (("stdout", done.stdout), ("stderr", done.stderr)):
        if capture.truncated:
            violations.append(Violation("limits.output", f"{name} cut at {limit} bytes"))
        if isinstance(capture, Forward) and capture.failed:
            violations.append(Violation(OUTPUT_FAILED, f"{name} could not be written on "
                                        f"({capture.failed}): what followed was lost"))
    return Result(
        exit_code=done.end.exit_code, signal=done.end.signal,
        stdout=bytes(done.stdout.data) if stdout == KEEP else None,
        stderr=bytes(done.stderr.data) if stderr == KEEP else None,
        stdout_truncated=done.stdout.truncated, stderr_truncated=done.stderr.truncated,
        timed_out=done.timed_out, cancelled=done.cancelled,
        duration=time.monotonic() - started, backend=backend.name,
        digest=request.digest, request_id=request.request_id,
        violations=tuple(violations), enforced=handle.enforced,
        network_log=tuple(handle.network_log),
        timings=stage_timings(handle.stages),
        args=list(request.argv), timeout=timeout, changes=changes,
    )


OUTPUT_FAILED = "output_failed"  # the kind of a Violation: a relayed stream could not be written


def _home_unwritable(request: LaunchRequest, done: Outcome) -> Violation | None:
    """A hint, said as a `filesystem.home` violation: a command that failed naming a path in
    its home on stderr, where that home is not a write root (home = "host": read-only or not
    in the view), most likely met a tool's cache or configuration there (npm, pip, cargo...).
    (What the command printed decides: it can only add this hint, never remove a refusal.)"""
    home = dict(request.env).get("HOME", "")
    if done.end.exit_code in (0, None) or not os.path.isabs(home) or any(
            home == g.path or home.startswith(g.path.rstrip("/") + "/") for g in request.write):
        return None
    stderr = done.stderr
    text = bytes(stderr.data) if not isinstance(stderr, Forward) else stderr.tail
    if os.fsencode(home.rstrip("/") + "/") not in text:
        return None
    return Violation("filesystem.home", f"the command failed naming a path in its home {home}, "
                     'which is not writable here (filesystem.home = "host"): a tool that keeps '
                     'a cache or configuration there needs filesystem.home = "private" (the '
                     "workspace-write preset has it) or that directory as a write root")


def _overlaid(backend: Backend, request: LaunchRequest) -> tuple[LaunchRequest, ChangeSet | None]:
    """`request` with its change set (filesystem.workspace = "overlay"), made now, before the
    sandbox starts; a backend that cannot overlay a workspace refuses it."""
    if request.workspace != "overlay":
        return request, None
    if not backend.overlay_workspace:
        raise UnenforceableError("filesystem.workspace", f"the {backend.name} backend cannot "
                                 'give a copy-on-write workspace (filesystem.workspace = '
                                 '"overlay"); the Linux backend with namespaces can')
    if request.changes_dir:  # (a warm sandbox's: its session owns the change set)
        return request, None
    return with_changes(request)


def with_changes(request: LaunchRequest) -> tuple[LaunchRequest, ChangeSet]:
    """A new change set for `request` (stockade/lifecycle/changes.py), and the request
    pointing at it, for its overlay layers."""
    from stockade.lifecycle import changes

    made = changes.begin(request.request_id, request.argv,
                         [grant.path for grant in request.write], protected=request.protected,
                         git=request.git, deny=[grant.path for grant in request.deny])
    return replace(request, changes_dir=made.path), made


def _settled(changes: ChangeSet | None, exit_code: int | None) -> ChangeSet | None:
    """The run is over: its change set records so, and is returned pending; one that holds
    no change (nothing written, or the command never ran) is dropped: None."""
    if changes is None:
        return None
    changes.finish(exit_code)
    if changes.changes():
        return changes
    changes.discard()
    return None


def stage_timings(stages: list[tuple[str, float]]) -> dict[str, float]:
    """Milliseconds each stage took, from the end of the one before it."""
    return {name: round((t - before) * 1000, 3)
            for (_, before), (name, t) in zip(stages, stages[1:], strict=False)}


def restricts_nothing(policy: Policy) -> bool:
    """True only for a policy that grants everything: write "/", no deny or protected names,
    a writable `.git`, executing from writable places, any network, and no limits."""
    fs = policy.filesystem
    return (tuple(fs.write) == ("/",) and not fs.deny and not fs.protected
            and fs.git == "writable" and fs.exec_from_write
            and policy.network.mode == "any"
            and all(value is None for value in vars(policy.limits).values()))


def run_unsandboxed(argv: list[str], policy: Policy) -> int:
    """Run `argv` on the host with NO sandbox, after a warning; refused (UnenforceableError
    `unenforceable:unsandboxed`) unless `policy` restricts nothing at all."""
    if not restricts_nothing(policy):
        raise UnenforceableError(
            "unsandboxed", "refusing to run without a sandbox: the policy restricts something")
    print("stockade: WARNING: running WITHOUT a sandbox", file=sys.stderr)
    return subprocess.run(argv).returncode
