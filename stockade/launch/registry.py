"""The one registry of sandbox backends, native and VM containment alike; the manager
(manager.py) chooses among what is registered here.

Platforms register themselves: each package named in PLATFORMS has a `registration` module
(stockade/linux/registration.py, ...) that calls `register` for what it offers. The registry
imports those modules by name, once, the first time it is asked, and nothing else of theirs:
an entry's backend is imported only when the entry is made (`create`), and a backend whose
import fails on this host (a module it lacks) is a typed refusal, `backend_unavailable`,
never a traceback. Nothing below the platform packages imports one of them
(tests/test_import_graph.py); this loader is the one place that names them.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stockade.errors import UnavailableError
from stockade.launch.backend import Backend

PLATFORMS = ("linux", "windows", "vm")  # the packages that register something here
NATIVE, VM = "native", "vm"  # a policy's `containment` (policy.model.CONTAINMENTS)


@dataclass(frozen=True)
class Entry:
    """One backend: its name, the containment it provides, the hosts (`sys.platform` values)
    it runs on, and `load`, which imports it and returns its class (made with no arguments).

    `prepare`, if set, is what a process that will launch exactly one sandbox of this backend
    may start before it compiles the request (the Linux backend forks its sandbox's skeleton
    meanwhile). `record_kinds`, if set, registers the launch-ledger kinds its launches write
    (lifecycle/removers.py), so that a reconcile knows them before it reads any record."""

    name: str
    containment: str
    hosts: tuple[str, ...]
    load: Callable[[], type[Backend]]
    prepare: Callable[[], None] | None = None
    record_kinds: Callable[[], None] | None = None

    def runs_here(self) -> bool:
        return sys.platform in self.hosts


ENTRIES: dict[str, Entry] = {}  # by name, in registration order
_loaded = False
_loading = threading.Lock()


def register(entry: Entry) -> None:
    """Add `entry` (called by each platform's registration module); a name is registered
    once."""
    if entry.containment not in (NATIVE, VM):
        raise ValueError(f"containment must be {NATIVE!r} or {VM!r}")
    if entry.name in ENTRIES:
        raise ValueError(f"a backend named {entry.name!r} is already registered")
    ENTRIES[entry.name] = entry


def _load() -> None:
    global _loaded
    with _loading:
        if not _loaded:
            for package in PLATFORMS:
                importlib.import_module(f"stockade.{package}.registration")
            _loaded = True


def entries(containment: str | None = None) -> list[Entry]:
    """The registered entries (of `containment`, if given): those that run on this host
    first, each group in registration order."""
    _load()
    chosen = [e for e in ENTRIES.values() if containment in (None, e.containment)]
    return sorted(chosen, key=lambda e: not e.runs_here())


def here(containment: str) -> list[Entry]:
    """The entries of `containment` that run on this host, best first: what `auto` tries."""
    return [e for e in entries(containment) if e.runs_here()]


def names(containment: str | None = None) -> list[str]:
    return [e.name for e in entries(containment)]


def entry(name: str) -> Entry:
    """The entry named `name`; UnavailableError for one nobody registered."""
    _load()
    if name not in ENTRIES:
        raise UnavailableError("backend_unavailable",
                               f"unknown backend {name!r} (known: {', '.join(ENTRIES)})")
    return ENTRIES[name]


def native() -> Entry:
    """This host's native backend (on a host none runs on, the first registered, whose own
    probe then says why it cannot run)."""
    return entries(NATIVE)[0]


def create(chosen: Entry) -> Backend:
    """A fresh backend of `chosen`; UnavailableError (`backend_unavailable`) if it cannot be
    loaded on this host."""
    try:
        kind = chosen.load()
    except Exception as exc:  # noqa: BLE001 - whatever its import raised: it cannot run here
        raise UnavailableError(
            "backend_unavailable", f"the {chosen.name} backend cannot be loaded on this host "
            f"({type(exc).__name__}: {exc})") from None
    return kind()


def prepare(containment: str) -> None:
    """In a process that will launch exactly one sandbox of `containment`: start what the
    backend `auto` tries first may start before the request is compiled (`Entry.prepare`)."""
    chosen = here(containment)
    if chosen and chosen[0].prepare is not None:
        chosen[0].prepare()


def load_record_kinds() -> None:
    """Register the ledger kinds of every backend that runs on this host."""
    for each in entries():
        if each.runs_here() and each.record_kinds is not None:
            each.record_kinds()
