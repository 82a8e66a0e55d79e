"""The contract every backend implements, and the handle a launch returns."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from stockade.errors import UnavailableError, UnenforceableError
from stockade.launch.request import LaunchRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from stockade.launch.probe import Attestation, PlatformProbe
    from stockade.launch.report import Row


@dataclass(frozen=True)
class Exit:
    """How the sandbox ended. `failure` is set when the sandbox, not the command, failed."""

    exit_code: int | None
    signal: int | None
    failure: Exception | None = None


@dataclass(frozen=True)
class Capability:
    """One row of the enforcement report."""

    name: str
    enforced: bool
    mechanism: str
    detail: str = ""


@dataclass
class Stdio:
    """What the launched command's stdin/stdout/stderr are (file objects or fds, or None)."""

    stdin: int | IO | None = None
    stdout: int | IO | None = None
    stderr: int | IO | None = None


class Handle(abc.ABC):
    """A live launch. The caller owns it: it must be waited for or killed."""

    stdin: IO[bytes] | None = None
    stdout: IO[bytes] | None = None
    stderr: IO[bytes] | None = None
    enforced: dict  # what this launch enforced, layer by layer (set by the backend)
    # (stage, CLOCK_MONOTONIC time it ended), in order; the first is the spawn itself
    stages: list[tuple[str, float]]
    violations: list  # Violations the backend observed (e.g. network denials), after wait()
    network_log: list  # the egress proxy's decision records, after wait()
    pid: int  # the host pid of the sandbox's root process (while it runs)

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> Exit | None:
        """Wait for the sandbox to end; None if `timeout` passed first."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the whole sandbox tree now (idempotent). Called again while the tree lingers
        (the pump does, after a deadline or cancel), a backend whose first kill asks
        something in the sandbox to end the tree forces it once that had its time."""

    def status_reader(self) -> tuple[int, Callable[[], bool]] | None:
        """A descriptor of the backend's own to read while the streams are pumped, so that
        what writes it never waits on it, and what reads it (False once it has ended);
        None: there is none."""
        return None

    def network_records(self) -> list[dict]:
        """The egress proxy's decision records so far, while the sandbox runs (a warm
        sandbox's commands each take theirs); none where there is no proxy."""
        return []

    def refusals(self) -> list:
        """The Violations the sandbox reported since the last call (read now, without
        waiting), while it runs: a warm sandbox's commands each take those that came while
        they ran (memory refused, protected names not made, git's files guarded). Empty where
        the backend reports them only at the end, or not at all."""
        return []


class Backend(abc.ABC):
    name: str = ""
    # Whether it mounts write roots as overlays (filesystem.workspace = "overlay"); one that
    # does not refuses such a request, typed (SandboxManager, stockade/lifecycle/changes.py).
    overlay_workspace: bool = False

    @abc.abstractmethod
    def probe(self) -> None:
        """Raise UnavailableError (typed reason) unless this backend can run on this host."""

    @abc.abstractmethod
    def check(self, request: LaunchRequest) -> None:
        """Raise UnenforceableError naming the capability this host cannot enforce."""

    @abc.abstractmethod
    def spawn(self, request: LaunchRequest, stdio: Stdio) -> Handle:
        """Start `request` in a fresh sandbox (stdio given as pipes/fds/None)."""

    @abc.abstractmethod
    def report(self) -> list[Capability]:
        """What this backend enforces on this host, capability by capability."""

    def readiness_probe(self) -> PlatformProbe:
        """The platform half of this backend's readiness probe (stockade/launch/probe.py);
        a backend without one is never ready."""
        raise UnavailableError("probe_unavailable",
                               f"the {self.name} backend has no readiness probe")

    def report_rows(self, attestation: Attestation) -> tuple[Row, ...]:
        """The enforcement report's rows for this backend (stockade/launch/report.py),
        computed from its attestation."""
        raise UnavailableError("report_unavailable",
                               f"the {self.name} backend has no enforcement report")


def refuse_other_containment(request: LaunchRequest, backend: str, provides: str) -> None:
    """UnenforceableError unless `request` asks for the containment `backend` provides (the
    manager chooses by containment; this holds for any other caller too)."""
    if request.containment != provides:
        raise UnenforceableError("containment", f'containment = "{request.containment}": the '
                                 f"{backend} backend provides {provides!r} containment only")
