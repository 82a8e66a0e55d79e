"""Run the evidence matrix: each row's setup, launch, child-side judge and host-side checks,
one verdict per row (`pass`, `FAIL`, or `not-run` with the reason), and the total time.
"""

from __future__ import annotations

import getpass
import os
import platform
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from stockade.errors import UnavailableError, UnenforceableError
from stockade.evidence import launches
from stockade.evidence.row import Launch, Row
from stockade.evidence.rows import ROWS
from stockade.evidence.scene import NotRunnable, Scene
from stockade.evidence.watch import Finding, Survivors, Unchanged
from stockade.launch.backend import Backend

OBSERVED_LIMIT = 400  # characters of the child's side kept in a verdict


@dataclass(frozen=True)
class Verdict:
    id: str
    category: str
    attempt: str
    expected: str
    status: str        # pass | FAIL | not-run
    observed: str      # for not-run: the reason
    seconds: float

    @property
    def verdict(self) -> str:
        return f"not-run: {self.observed}" if self.status == "not-run" else self.status


@dataclass(frozen=True)
class Matrix:
    verdicts: tuple[Verdict, ...]
    seconds: float
    host: dict[str, Any]

    def count(self, status: str) -> int:
        return sum(v.status == status for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "seconds": round(self.seconds, 2),
                "passed": self.count("pass"), "failed": self.count("FAIL"),
                "not_run": self.count("not-run"),
                "rows": [asdict(v) | {"verdict": v.verdict, "seconds": round(v.seconds, 2)}
                         for v in self.verdicts]}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Matrix:
        """The Matrix that `to_json` described (as printed by `stockade evidence --json`)."""
        names = [f.name for f in fields(Verdict)]
        verdicts = tuple(Verdict(**{name: row[name] for name in names})
                         for row in document["rows"])
        return cls(verdicts, document["seconds"], document["host"])


def select(only: Iterable[str] = ()) -> tuple[Row, ...]:
    """The rows of the categories (or with the ids) in `only`; all rows if it is empty."""
    wanted = set(only)
    return tuple(r for r in ROWS if not wanted or r.category in wanted or r.id in wanted)


def run_matrix(backend: Backend, rows: Iterable[Row] = ROWS,
               on_verdict: Callable[[Verdict], None] | None = None) -> Matrix:
    """Run `rows` one after another in `backend`; `on_verdict` sees each verdict as it comes."""
    started = time.monotonic()
    tag = secrets.token_hex(4)
    base = Path(tempfile.mkdtemp(prefix="evidence-", dir=scene_base()))
    verdicts = []
    try:
        try:
            backend.probe()
            unavailable = ""
        except UnavailableError as exc:
            unavailable = exc.code
        for row in rows:
            verdict = (_not_run(row, unavailable, 0.0) if unavailable
                       else run_row(row, backend, base, tag))
            verdicts.append(verdict)
            if on_verdict:
                on_verdict(verdict)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return Matrix(tuple(verdicts), time.monotonic() - started, describe_host(backend))


def scene_base() -> str:
    """Where scenes live: not below /tmp, where the sandbox's private /tmp would hold the
    directories above each workspace, so that writing there would look like an escape."""
    return "/var/tmp" if os.access("/var/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()


def run_row(row: Row, backend: Backend, base: Path, tag: str) -> Verdict:
    """One row: set up its scene, launch, judge the child's side and the host's side."""
    started = time.monotonic()
    scene = Scene(base, row.id, tag)
    try:
        row.setup(scene)
        scene.watch(Unchanged(scene.outside, "outside tree"))
        launch = (row.launch or launches.attack)(row, scene, backend)
        child = row.judge(scene, launch)
        host = [w.finish() for w in scene.watches]
        host += [_no_leak(scene, launch), Survivors(scene.marker).finish()]
    except NotRunnable as exc:
        return _not_run(row, str(exc), time.monotonic() - started)
    except (UnavailableError, UnenforceableError) as exc:
        if not row.fails_closed_with or exc.code != row.fails_closed_with:
            return _not_run(row, exc.code, time.monotonic() - started)
        host = [w.finish() for w in scene.watches]
        observed = f"launch refused: {exc.code} (fails closed) | host: " + "; ".join(
            f.text for f in host)
        return Verdict(row.id, row.category, row.attempt, row.expected,
                       "pass" if all(f.ok for f in host) else "FAIL", observed,
                       time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001 - one broken row must not hide the others
        return Verdict(row.id, row.category, row.attempt, row.expected, "FAIL",
                       f"the row could not be evaluated: {exc!r}", time.monotonic() - started)
    finally:
        scene.close()
    passed = child.ok and all(f.ok for f in host)
    child_text = child.text.replace(str(scene.root), "<scene>")
    if len(child_text) > OBSERVED_LIMIT:
        child_text = child_text[:OBSERVED_LIMIT] + "…"
    observed = f"{child_text} | host: " + "; ".join(f.text for f in host)
    return Verdict(row.id, row.category, row.attempt, row.expected,
                   "pass" if passed else "FAIL", observed, time.monotonic() - started)


def _not_run(row: Row, reason: str, seconds: float) -> Verdict:
    return Verdict(row.id, row.category, row.attempt, row.expected, "not-run", reason, seconds)


def _no_leak(scene: Scene, launch: Launch) -> Finding:
    runs = [launch.result] if launch.result else list(launch.runs)
    output = b"".join(run.stdout + run.stderr for run in runs)
    leaked = sum(secret.encode() in output for secret in scene.secrets)
    if leaked:
        return Finding(False, f"{leaked} host secret(s) LEAKED into the child's output")
    return Finding(True, "no secret in output")


KERNEL_KNOBS = ("dev/tty/legacy_tiocsti", "kernel/unprivileged_bpf_disabled",
                "kernel/perf_event_paranoid", "kernel/io_uring_disabled",
                "vm/unprivileged_userfaultfd", "kernel/yama/ptrace_scope")


def _user(uid: int | None) -> str:
    """The name of the user the matrix runs as: the account's (POSIX), else the login name."""
    if uid is None:
        return getpass.getuser()
    import pwd

    return pwd.getpwuid(uid).pw_name


def describe_host(backend: Backend) -> dict[str, Any]:
    """What the matrix ran on: kernel, user, backend features, and the kernel's own knobs that
    decide what a weakened layer would still stop."""
    uid = os.getuid() if hasattr(os, "getuid") else None  # (None on Windows)
    facts: dict[str, Any] = {
        "kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "uid": uid, "user": _user(uid),
        "mode": "unknown" if uid is None else "root" if uid == 0 else "rootless",
        "backend": backend.name,
        "features": {c.name: c.mechanism for c in backend.report() if c.enforced},
    }
    if backend.name == "linux":
        from stockade.linux import landlock
        facts["landlock"] = landlock.describe()
        facts["kernel_knobs"] = {knob: _read(f"/proc/sys/{knob}") for knob in KERNEL_KNOBS}
    return facts


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "absent"
