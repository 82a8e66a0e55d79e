"""The readiness probe: a real throwaway launch under the production backend, checked from
inside and from outside, summed up in an attestation.

Stages, in order; the first that fails names the reason and the stage:

- `backend`: the backend's own host checks (`Backend.probe`);
- `ledger`: reconcile what crashed launches left, and fail (`ledger_corrupt`) while a
  quarantined record awaits inspection;
- `launch`: a real launch of the backend's probe child, observed from inside and outside;
- `checks`: one stage per group of facts, each failing as `<stage>_not_enforced`;
- `lifetime` (among those): what the launch made is gone once it settled.

An attestation never holds a path, a secret or an environment value: facts are errno names,
numbers, flags and names. `require_ready` is the manager's cache: a pass holds for the process
lifetime, a failure for NEGATIVE_TTL seconds.

The stages `backend`, `ledger` and the cache are shared, here; what a launch observes and what
its facts must be are the backend's platform half (`PlatformProbe`, `Backend.readiness_probe`):
stockade/linux/probe.py, stockade/windows/probe.py.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol

from stockade.errors import StockadeError, UnavailableError
from stockade.launch import registry
from stockade.launch.backend import Backend
from stockade.lifecycle import facts, lease, statedir
from stockade.lifecycle.ledger import Ledger

ATTESTATION_VERSION = 1
NEGATIVE_TTL = 30.0  # seconds a failed probe is trusted before the manager probes again
_MESSAGES = {  # every platform's
    "ledger_corrupt": "a launch record could not be trusted and was quarantined for "
                      "inspection; see `stockade reconcile`",
}


@dataclass(frozen=True)
class Attestation:
    """What the probe verified on this host, or the stable reason and stage it failed at."""

    ready: bool
    backend: str
    run_as: str                      # "root" or "rootless"; on Windows "elevated" or "unelevated"
    versions: dict[str, object]
    facts: dict[str, object]         # one field per verified fact
    enforced: dict                   # what the probe sandbox's pid 1 reported applying
    timings: dict[str, float]        # milliseconds per probe stage
    duration_ms: float
    reason: str | None = None
    stage: str | None = None
    message: str | None = None
    version: int = ATTESTATION_VERSION

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Run:
    """One probe in progress: what it has seen so far, and the stage it is at."""

    backend: Backend
    facts: dict[str, object] = field(default_factory=dict)
    enforced: dict = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    stage: str = "backend"

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        self.stage, started = stage, time.monotonic()
        try:
            yield
        finally:
            self.timings[stage] = round((time.monotonic() - started) * 1000, 3)


class Refused(Exception):
    """The probe failed for `reason` (a stable code), said by `message`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message


class PlatformProbe(Protocol):
    """What the probe does differently per backend; the shared stages are `probe`'s."""

    messages: dict[str, str]  # a readable message per failure reason this platform adds
    legend: dict[str, str]  # what each fact it observes is, in one line

    def run_as(self) -> str:
        """Whom the probe runs as (`Attestation.run_as`)."""

    def versions(self) -> dict[str, object]:
        """What the attestation is valid for (`Attestation.versions`); never raises."""

    def launch(self, run: Run, ledger: Ledger) -> None:
        """The `launch` stage: a real launch, its observations recorded into `run`."""

    def judge(self, observed: dict[str, object]) -> None:
        """Raise facts.NotEnforced for the first stage whose facts do not hold."""

    def storage(self) -> tuple[dict[str, object], float] | None:
        """What a stored attestation is valid for, and seconds since boot now (sleep counted);
        None where passing attestations are not stored for later processes."""

    def explain(self, message: str) -> str:
        """A failure's message as this platform says it (Linux points to `stockade doctor`)."""


def probe(backend: Backend | None = None, ledger: Ledger | None = None, *,
          platform_half: PlatformProbe | None = None) -> Attestation:
    """Probe `backend` (default: this host's native one) now; never raises for a failed probe.
    `platform_half` defaults to the backend's own (`Backend.readiness_probe`)."""
    half = platform_half
    try:
        backend = backend or registry.create(registry.native())
        half = half or backend.readiness_probe()
    except UnavailableError as exc:  # (not loadable here, or without a probe: say so, typed)
        return _refused(backend, exc)
    started = time.monotonic()
    run = Run(backend)
    failure: Refused | None = None
    try:
        with run.timed("backend"):
            backend.probe()
        with run.timed("ledger"):
            ledger = ledger or Ledger()
            registry.load_record_kinds()  # (so that no record of theirs is taken as foreign)
            ledger.reconcile()
            ledger.check()
        with run.timed("launch"):
            half.launch(run, ledger)
        with run.timed("checks"):
            half.judge(run.facts)
    except StockadeError as exc:
        failure = Refused(exc.code, (_MESSAGES | half.messages).get(
            exc.code, exc.message if exc.code == "ledger_unusable"  # (it names the directory)
            else f"the {run.stage} stage failed ({exc.code})"))
        if exc.code != "ledger_corrupt":  # (that one is `stockade reconcile`'s)
            failure = Refused(failure.reason, half.explain(failure.message))
    except OSError as exc:
        where = f" at {exc.filename}" if exc.filename else ""
        failure = Refused("probe_failed", f"the {run.stage} stage failed with "
                                          f"{errno.errorcode.get(exc.errno or 0, 'an error')}"
                                          f"{where}")
    except Refused as refused:
        failure = refused
    except facts.NotEnforced as exc:
        run.stage = exc.stage
        failure = Refused(f"{exc.stage}_not_enforced", exc.message)
    return Attestation(
        ready=failure is None, backend=backend.name, run_as=half.run_as(),
        versions=half.versions(), facts=run.facts, enforced=run.enforced, timings=run.timings,
        duration_ms=round((time.monotonic() - started) * 1000, 3),
        reason=failure.reason if failure else None, stage=run.stage if failure else None,
        message=failure.message if failure else None)


def legend(backend: str) -> dict[str, str]:
    """What each fact of backend `backend`'s attestations is, in one line (the facts are
    names and values only; `stockade probe --explain`)."""
    return registry.create(registry.entry(backend)).readiness_probe().legend


def _refused(backend: Backend | None, error: UnavailableError) -> Attestation:
    """The attestation of a backend that could not be probed at all (it cannot be loaded
    here, or has no readiness probe): not ready, at the `backend` stage."""
    return Attestation(
        ready=False, backend=backend.name if backend else registry.native().name,
        run_as="unknown", versions={}, facts={}, enforced={}, timings={}, duration_ms=0.0,
        reason=error.code, stage="backend", message=error.message)


_cache: dict[str, tuple[Attestation, float]] = {}
_cache_lock = threading.Lock()


def require_ready(backend: Backend) -> Attestation:
    """The cached attestation of `backend`, probing first if there is none or a failed one
    has expired; raises UnavailableError with its reason unless it is ready.

    A passing attestation is also kept in the state directory, for later processes of the same
    user on the same boot, with the same versions, for STORED_TTL seconds (so that each
    `stockade run` does not launch a probe sandbox first). Such a process still runs the
    backend's host checks and reconciles the ledger, as every start must."""
    with _cache_lock:
        cached = _cache.get(backend.name)
        if cached is None or (not cached[0].ready
                              and time.monotonic() - cached[1] >= NEGATIVE_TTL):
            cached = (_stored_or_probe(backend), time.monotonic())
            _cache[backend.name] = cached
    attestation = cached[0]
    if not attestation.ready:
        raise UnavailableError(attestation.reason or "probe_failed", attestation.message or "")
    return attestation


STORED_TTL = 600.0  # seconds a stored passing attestation is trusted by a new process


def _stored_or_probe(backend: Backend) -> Attestation:
    storage = backend.readiness_probe().storage()
    if storage is None:
        return probe(backend)
    key, now = storage
    path = os.path.join(statedir.state_dir(), f"attestation-{backend.name}.json")
    stored = _load(path, key, now)
    if stored is not None:
        try:
            backend.probe()
            ledger = Ledger()
            registry.load_record_kinds()
            ledger.reconcile()
            ledger.check()
            return stored
        except StockadeError:
            pass  # something changed: the full probe says what
    attestation = probe(backend)
    if attestation.ready:
        _store(path, attestation, key, now)
    return attestation


def _load(path: str, key: dict[str, object], now: float) -> Attestation | None:
    try:
        with open(path) as f:
            body = json.load(f)
        if body["key"] != key or not 0 <= now - body["at"] < STORED_TTL:
            return None
        attestation = Attestation(**body["attestation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return attestation if attestation.ready and attestation.version == ATTESTATION_VERSION \
        else None


def _store(path: str, attestation: Attestation, key: dict[str, object], now: float) -> None:
    """Atomically (and only where the state directory is ours; never fatal)."""
    body = {"key": key, "at": now, "attestation": attestation.to_json()}
    try:
        statedir.ensure(os.path.dirname(path))
        temporary = f"{path}.{os.getpid()}.tmp"
        # (lease's flags: O_CLOEXEC is POSIX's, and an AttributeError here is not caught)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | lease.OPEN_FLAGS, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(temporary, path)
    except (OSError, StockadeError):
        pass
