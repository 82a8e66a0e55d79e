"""Run the evidence matrix: each row's setup, launch, child-side judge and host-side checks, then
its positive control (the same attack where nothing refuses it must work); one verdict per row
(`pass`, `FAIL`, `ERROR`, or `not-run` with the reason), with the mutations that prove the row
and what its control showed, and the total time.
"""

from __future__ import annotations

import getpass
import os
import platform
import secrets
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from stockade.errors import UnavailableError, UnenforceableError
from stockade.evidence import launches
from stockade.evidence.judges import NotEnforced, attempts
from stockade.evidence.row import Launch, Row
from stockade.evidence.rows import ROWS
from stockade.evidence.scene import NotRunnable, Scene
from stockade.evidence.watch import Finding, Survivors, Unchanged, end_processes
from stockade.launch.backend import Backend

OBSERVED_LIMIT = 400  # characters of the child's side kept in a verdict
DEADLINE = 60.0  # seconds a row's launch may take before the runner ends it
STATUSES = ("pass", "FAIL", "ERROR", "not-run", "not-enforced")


@dataclass(frozen=True)
class Verdict:
    id: str
    category: str
    attempt: str
    expected: str
    status: str        # pass | FAIL | ERROR | not-run | not-enforced (by this isolation)
    observed: str      # for not-run: the reason
    seconds: float
    mutations: tuple[str, ...] = ()  # the switch sets that make this row fail here
    unproven: str = ""               # why none can, if none does
    control: str = ""                # what the positive control showed ("" if it did not run)
    controlled: bool = False         # it ran, and the attack worked there
    capability: str = ""             # the enforcement report's row it attests (tier rows)

    @property
    def verdict(self) -> str:
        return f"not-run: {self.observed}" if self.status == "not-run" else self.status

    @property
    def proven(self) -> bool:
        return bool(self.mutations)


@dataclass(frozen=True)
class Matrix:
    verdicts: tuple[Verdict, ...]
    seconds: float
    host: dict[str, Any]

    def count(self, status: str) -> int:
        return sum(v.status == status for v in self.verdicts)

    @property
    def proven(self) -> int:
        """Rows that passed here and that a switch is shown to make fail."""
        return sum(v.proven and v.status == "pass" for v in self.verdicts)

    @property
    def controlled(self) -> int:
        return sum(v.controlled for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "seconds": round(self.seconds, 2),
                "passed": self.count("pass"), "failed": self.count("FAIL"),
                "errors": self.count("ERROR"), "not_run": self.count("not-run"),
                "not_enforced": self.count("not-enforced"),
                "proven": self.proven, "controlled": self.controlled,
                "rows": [asdict(v) | {"verdict": v.verdict, "seconds": round(v.seconds, 2)}
                         for v in self.verdicts]}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Matrix:
        """The Matrix that `to_json` described (as printed by `stockade evidence --json`)."""
        names = [f.name for f in fields(Verdict)]
        verdicts = tuple(Verdict(**{name: tuple(row[name]) if name == "mutations" else row[name]
                                    for name in names if name in row})
                         for row in document["rows"])
        return cls(verdicts, document["seconds"], document["host"])


def select(only: Iterable[str] = (), rows: Iterable[Row] = ROWS) -> tuple[Row, ...]:
    """The `rows` of the categories (or with the ids) in `only`; all of them if it is empty."""
    wanted = set(only)
    return tuple(r for r in rows if not wanted or r.category in wanted or r.id in wanted)


def run_matrix(backend: Backend, rows: Iterable[Row] = ROWS,
               on_verdict: Callable[[Verdict], None] | None = None, *,
               controls: bool = True) -> Matrix:
    """Run `rows` one after another in `backend` (each with its positive control unless not
    `controls`); `on_verdict` sees each verdict as it comes."""
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
            verdict = (_verdict(row, "not-run", unavailable, 0.0) if unavailable
                       else run_row(row, backend, base, tag, controls=controls))
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


@dataclass
class Seen:
    """One run of a row's attack (sandboxed, or its control) and the findings on it."""

    launch: Launch
    child: Finding
    host: list[Finding]
    attempted: dict[str, str]  # the attempts made (by normalised name) -> how refused
    name: Callable[[str], str] = field(repr=False, default=str)

    @property
    def status(self) -> str:
        findings = [self.child, *self.host]
        if any(not f.ok and not f.error for f in findings):
            return "FAIL"
        return "ERROR" if any(not f.ok for f in findings) else "pass"

    def text(self, scene_root: str) -> str:
        child = self.child.text.replace(scene_root, "<scene>")
        if len(child) > OBSERVED_LIMIT:
            child = child[:OBSERVED_LIMIT] + "…"
        return f"{child} | host: " + "; ".join(f.text for f in self.host)


def run_row(row: Row, backend: Backend, base: Path, tag: str, *,
            controls: bool = True) -> Verdict:
    """One row: its attack in `backend`, judged on the child's side and the host's; then,
    if it passed, its positive control."""
    started = time.monotonic()
    if row.root_only and os.getuid() != 0:
        return _verdict(row, "not-run", f"needs root: {row.root_only}", 0.0)
    try:
        seen, root = run_attack(row, backend, base, tag)
    except NotRunnable as exc:
        return _verdict(row, "not-run", str(exc), time.monotonic() - started)
    except (UnavailableError, UnenforceableError) as exc:
        return _verdict(row, "not-run", exc.code, time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001 - one broken row must not hide the others
        return _verdict(row, "ERROR", f"the row could not be evaluated: {exc!r}{_raised(exc)}",
                        time.monotonic() - started)
    status, observed = seen.status, seen.text(root)
    if isinstance(row.expect, NotEnforced):  # (what the host saw is the gap, shown)
        status = "not-enforced" if seen.child.ok else "ERROR"
    control, controlled = "", False
    if controls and status == "pass" and row.control is None:
        control = f"none: {row.uncontrolled}"
    elif controls and status == "pass":
        controlled, control = run_control(row, backend, base, tag, seen)
        if not controlled:
            status = "ERROR"
            observed += f" | control FAILED: {control}"
    return _verdict(row, status, observed, time.monotonic() - started, control, controlled)


def run_attack(row: Row, backend: Backend | None, base: Path, tag: str, *, suffix: str = "",
               deadline: float | None = None, grace: float = Survivors.GRACE
               ) -> tuple[Seen, str]:
    """Set up a scene, launch the row's attack in `backend` (None: on the host), and judge
    both sides; (what was seen, the scene's root). A launch still running after `deadline`
    (the row's own by default) is ended by killing the processes that carry the marker."""
    scene = Scene(base, row.id + suffix, tag)
    try:
        row.setup(scene)
        scene.watch(Unchanged(scene.outside, "outside tree"))
        watchdog = Watchdog(scene, deadline or row_deadline(row))
        try:
            try:
                launch = (row.launch or launches.attack)(row, scene, backend)
            except UnenforceableError as exc:
                if not row.expect.refused_with(exc.code):
                    raise
                launch = Launch(error=exc)
        finally:
            watchdog.stop()
        if watchdog.fired:
            launch = replace(launch, facts={**launch.facts, "watchdog": True})
        child = row.expect.judge(row, scene, launch)
        host = [w.finish() for w in scene.watches]
        host += [_no_leak(scene, launch), Survivors(scene.marker, grace).finish()]
        name = normaliser(scene)
        runs = [launch.result] if launch.result else list(launch.runs)
        made = {name(line.name): line.detail for run in runs for line in attempts(run)}
        return Seen(launch, child, host, made, name), str(scene.root)
    finally:
        end_processes(list(launches.marker_processes(scene)))
        scene.close()


def run_control(row: Row, backend: Backend, base: Path, tag: str, seen: Seen
                ) -> tuple[bool, str]:
    """The row's positive control: (whether the attack worked there, what it showed)."""
    control = row.control
    assert control is not None
    target: Backend | None = None
    if not control.on_host:
        weakened = getattr(backend, "weakened", None)
        if weakened is None:
            return False, f"{backend.name} has no switches to run it {control.describe()}"
        target = weakened(control.weaken)
    try:
        ran, _ = run_attack(row, target, base, tag, suffix="-control",
                            deadline=control.deadline, grace=0.0)
    except (NotRunnable, UnavailableError, UnenforceableError) as exc:
        return False, f"{control.describe()}: could not run: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported as the row's ERROR
        return False, f"{control.describe()}: could not be evaluated: {exc!r}{_raised(exc)}"
    found = row.expect.worked(ran.launch, ran.host, seen.attempted, ran.name)
    return found.ok, f"{control.describe()}: {found.text}"


def _raised(exc: BaseException) -> str:
    """Where `exc` was raised (" at FILE:LINE (FUNCTION)"): an ERROR that says only
    PermissionError(13) cannot be told from the next one."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {os.path.basename(last.filename)}:{last.lineno} ({last.name})"


def row_deadline(row: Row) -> float:
    """How long a row's launch may run: a little past what its expectation allows."""
    within = getattr(row.expect, "within", None)
    return within + 1.0 if within is not None else DEADLINE


class Watchdog:
    """Ends a launch still running after `seconds`: every process carrying the scene's marker
    is killed (its sandbox, if any, then ends with it)."""

    def __init__(self, scene: Scene, seconds: float) -> None:
        self.scene, self.fired = scene, False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        end_processes(list(launches.marker_processes(self.scene)))

    def stop(self) -> None:
        self.timer.cancel()


def normaliser(scene: Scene) -> Callable[[str], str]:
    """Attempt names with the scene's own values (paths, ports, pids) as their placeholders,
    so that a control's attempts, in a scene of their own, compare with the sandboxed run's."""
    values = sorted(((value, key) for key, value in scene.values.items() if len(value) > 1),
                    key=lambda item: -len(item[0]))

    def name(text: str) -> str:
        for value, key in values:
            text = text.replace(value, "{" + key + "}")
        return text
    return name


def _verdict(row: Row, status: str, observed: str, seconds: float, control: str = "",
             controlled: bool = False) -> Verdict:
    return Verdict(row.id, row.category, row.attempt, row.expected, status, observed, seconds,
                   tuple(m.describe() for m in row.mutations()), row.unproven, control,
                   controlled, row.capability)


def _no_leak(scene: Scene, launch: Launch) -> Finding:
    runs = [launch.result] if launch.result else list(launch.runs)
    output = b"".join(_bytes(run.stdout) + _bytes(run.stderr) for run in runs)
    leaked = sum(secret.encode() in output for secret in scene.secrets)
    if leaked:
        return Finding(False, f"{leaked} host secret(s) LEAKED into the child's output")
    return Finding(True, "no secret in output")


def _bytes(data: bytes | str | None) -> bytes:
    return data if isinstance(data, bytes) else (data or "").encode()


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
        "backend": backend.name, "isolation": getattr(backend, "isolation", "namespaces"),
        "features": {c.name: c.mechanism for c in backend.report() if c.enforced},
    }
    if backend.name.startswith("linux"):
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
