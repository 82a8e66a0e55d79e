"""SandboxManager: picks a backend and runs a LaunchRequest in it. It never runs a command
unsandboxed; `run_unsandboxed` is the one, separately named, way to do that.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from stockade.errors import UnavailableError, UnenforceableError, UsageError
from stockade.launch.backend import Backend, Exit, Handle, Stdio
from stockade.launch.request import LaunchRequest
from stockade.launch.result import Result, Violation
from stockade.policy.model import Policy

MODES = ("require", "auto")
DEFAULT_OUTPUT_LIMIT = 16 << 20
CANCEL_POLL = 0.05  # seconds between checks of a cancel event


def _linux() -> Backend:
    from stockade.linux.backend import LinuxBackend
    return LinuxBackend()


# Backends by name, best first; factories so that importing one never requires another.
REGISTRY: dict[str, Callable[[], Backend]] = {"linux": _linux}


class SandboxManager:
    """Chooses the backend: `require` a named one, or `auto` the best available that can
    enforce the whole request. Neither ever falls back to running on the host."""

    def __init__(self, backend: str | None = None, mode: str = "auto") -> None:
        if mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}")
        if mode == "require" and not backend:
            raise UsageError("mode 'require' needs a backend name")
        if backend and backend not in REGISTRY:
            raise UnavailableError("backend_unavailable",
                                   f"unknown backend {backend!r} (known: {', '.join(REGISTRY)})")
        self.mode = mode
        self.wanted = backend

    def select(self, request: LaunchRequest) -> Backend:
        """The backend that will run `request`, or the typed reason none can (the reason of
        the best backend, when several refuse)."""
        names = [self.wanted] if self.wanted else list(REGISTRY)
        refusals: list[UnavailableError | UnenforceableError] = []
        for name in names:
            backend = REGISTRY[name]()
            try:
                backend.probe()
                backend.check(request)
                return backend
            except (UnavailableError, UnenforceableError) as exc:
                refusals.append(exc)
        if refusals:
            raise refusals[0]
        raise UnavailableError("backend_unavailable", "no sandbox backend is registered")

    def run(self, request: LaunchRequest, *, input: bytes | None = None,
            stdio_inherit: bool = False, cancel: threading.Event | None = None) -> Result:
        """Run `request` to completion, capturing output within `limits.output`."""
        backend = self.select(request)
        return execute(backend, request, input=input, stdio_inherit=stdio_inherit,
                       cancel=cancel)


def execute(backend: Backend, request: LaunchRequest, *, input: bytes | None = None,
            stdio_inherit: bool = False, cancel: threading.Event | None = None) -> Result:
    """Spawn in `backend`, feed `input`, capture bounded output, enforce the timeout; setting
    `cancel` kills the whole sandbox tree."""
    limit = request.limits.output if request.limits.output is not None else DEFAULT_OUTPUT_LIMIT
    if input is not None:
        stdin: int | None = subprocess.PIPE
    elif request.stdin == "inherit":
        stdin = None
    else:
        stdin = subprocess.DEVNULL
    out = None if stdio_inherit else subprocess.PIPE
    started = time.monotonic()
    handle = backend.spawn(request, Stdio(stdin, out, out))
    pumps = [_Capture(stream, limit) for stream in (handle.stdout, handle.stderr) if stream]
    if input is not None and handle.stdin:
        threading.Thread(target=_feed, args=(handle.stdin, input), daemon=True).start()
    timeout = request.limits.timeout
    end, timed_out, cancelled = _wait(handle, timeout, cancel)
    for pump in pumps:
        pump.join()
    if end.failure is not None:
        raise end.failure
    stdout = pumps[0] if pumps else _Capture(None, 0)
    stderr = pumps[1] if len(pumps) > 1 else _Capture(None, 0)
    violations = []
    if timed_out:
        violations.append(Violation("limits.timeout", f"killed after {timeout:g}s"))
    if cancelled:
        violations.append(Violation("cancelled", "cancelled by the caller"))
    for name, pump in (("stdout", stdout), ("stderr", stderr)):
        if pump.truncated:
            violations.append(Violation("limits.output", f"{name} cut at {limit} bytes"))
    return Result(
        exit_code=end.exit_code, signal=end.signal,
        stdout=bytes(stdout.data), stderr=bytes(stderr.data),
        stdout_truncated=stdout.truncated, stderr_truncated=stderr.truncated,
        timed_out=timed_out, cancelled=cancelled,
        duration=time.monotonic() - started, backend=backend.name,
        digest=request.digest, request_id=request.request_id,
        violations=tuple(violations), enforced=handle.enforced,
    )


def _wait(handle: Handle, timeout: float | None,
          cancel: threading.Event | None) -> tuple[Exit, bool, bool]:
    """(exit, timed out, cancelled): kills the tree at the deadline or on cancel."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = CANCEL_POLL if cancel is not None else None
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0)
            step = left if step is None else min(step, left)
        end = handle.wait(step)
        if end is not None:
            return end, False, False
        timed_out = deadline is not None and time.monotonic() >= deadline
        if timed_out or (cancel is not None and cancel.is_set()):
            handle.kill()
            return handle.wait(), timed_out, not timed_out


class _Capture(threading.Thread):
    """Reads a stream to its end, keeping at most `limit` bytes (the rest is drained)."""

    def __init__(self, stream: IO[bytes] | None, limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.data = bytearray()
        self.truncated = False
        if stream is not None:
            self.start()

    def run(self) -> None:
        assert self.stream is not None
        with self.stream:
            while chunk := self.stream.read1(65536):
                room = self.limit - len(self.data)
                if len(chunk) > room:
                    self.truncated = True
                self.data += chunk[:max(room, 0)]

    def join(self, timeout: float | None = None) -> None:
        if self.stream is not None:
            super().join(timeout)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        with stream:
            stream.write(data)
    except (BrokenPipeError, ValueError):
        pass  # the command stopped reading; that is its business


def restricts_nothing(policy: Policy) -> bool:
    """True only for a policy that grants everything: write "/", no deny or protected names,
    executing from writable places, any network, and no limits."""
    fs = policy.filesystem
    return (tuple(fs.write) == ("/",) and not fs.deny and not fs.protected and fs.exec_from_write
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
