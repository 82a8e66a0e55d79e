"""The enforcement report: every capability of the policy language, as this host enforces it.

Computed, not looked up: each row's status comes from the facts the readiness probe verified in
a real sandbox (see probe.py), from what the backend accepts (`check` on a request that needs
the capability) and from what the probe sandbox's pid 1 reported applying. A row the probe did
not verify is never `enforced`.

- `enforced`: what the policy language promises holds here, through the mechanism named;
- `partial`: it holds only in part (one layer of two, per process instead of per tree, ...);
  the reason says which part;
- `unavailable`: the backend refuses policies that use it, or the probe could not verify it.

The rows are each backend's own (stockade/linux/report.py, stockade/windows/report.py), built
with the shared `row_maker`, `accepted`, `containment_row` and `driver_row` over its own facts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from stockade.errors import StockadeError
from stockade.launch import registry
from stockade.launch.backend import Backend
from stockade.launch.probe import Attestation
from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec

ENFORCED, PARTIAL, UNAVAILABLE = "enforced", "partial", "unavailable"
# How each `Attestation.run_as` reads in a heading.
_RUN_AS = {"root": "run as root", "rootless": "rootless", "elevated": "run elevated",
           "unelevated": "not elevated"}
# A request every backend's `check` accepts on its own platform, varied one field at a time by
# `accepted` (the Windows backend admits only drive paths: stockade/windows/report.py).
PLAIN_REQUEST = LaunchRequest(argv=("true",), cwd="/", env=())


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    mechanism: str
    reason: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "enforced": self.status == ENFORCED,
                "mechanism": self.mechanism, "reason": self.reason}


@dataclass(frozen=True)
class Report:
    attestation: Attestation
    rows: tuple[Row, ...]

    def to_json(self) -> dict:
        a = self.attestation
        return {"name": a.backend, "ready": a.ready, "reason": a.reason, "stage": a.stage,
                "run_as": a.run_as, "versions": a.versions,
                "capabilities": [row.to_json() for row in self.rows]}

    def heading(self) -> str:
        a = self.attestation
        state = "ready" if a.ready else f"NOT READY ({a.reason} at stage {a.stage})"
        return f"{a.backend}: {state}, {_RUN_AS.get(a.run_as, a.run_as)}"

    def versions(self) -> str:
        return ", ".join(f"{name} {value}" for name, value in self.attestation.versions.items())

    def text(self) -> str:
        width = max(len(r.name) for r in self.rows) + 2
        lines = [self.heading(), self.versions(), ""]
        for r in self.rows:
            lines.append(f"{r.name:<{width}}{r.status:<13}{r.mechanism}")
            if r.reason:
                lines.append(f"{'':<{width + 13}}({r.reason})")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [f"### {self.heading()}", "", f"Versions: {self.versions()}.", "",
                 "| capability | status | mechanism | reason |", "| --- | --- | --- | --- |"]
        lines += [f"| `{r.name}` | {r.status} | {_cell(r.mechanism)} | {_cell(r.reason)} |"
                  for r in self.rows]
        return "\n".join(lines) + "\n"


def build(attestation: Attestation, backend: Backend) -> Report:
    """The report for `backend`, from its attestation (see the module docstring): the rows are
    the backend's own (`Backend.report_rows`)."""
    return Report(attestation, backend.report_rows(attestation))


def row_maker(attestation: Attestation, holds: Callable[..., bool]) -> Callable[..., Row]:
    """`row(name, mechanism, layers, reason="", *, partial="")` over the attestation's facts,
    `holds(facts, *names)` saying whether the named facts were verified."""
    facts = attestation.facts

    def row(name: str, mechanism: str, layers: dict[str, tuple[str, ...]],
            reason: str = "", *, partial: str = "") -> Row:
        """`enforced` when every layer's facts were verified (`partial` with that reason if
        `partial` is given), `partial` when only some were, else `unavailable`."""
        held = [layer for layer, needed in layers.items() if holds(facts, *needed)]
        if len(held) == len(layers):
            return Row(name, PARTIAL if partial else ENFORCED, mechanism, partial or reason)
        if held:
            missing = ", ".join(layer for layer in layers if layer not in held)
            return Row(name, PARTIAL, mechanism, f"not in force here: {missing}")
        return Row(name, UNAVAILABLE, mechanism, _unverified(attestation))

    return row


def containment_row() -> Row:
    """`containment = "vm"`: whether this host has what its VM driver needs to boot a guest
    (`driver_row`)."""
    drivers = registry.here(registry.VM)
    if not drivers:
        return Row("containment.vm", UNAVAILABLE, "a VM guest", "no VM driver runs on this host")
    return driver_row("containment.vm", drivers[0])


def driver_row(name: str, entry: registry.Entry) -> Row:
    """Row `name`: whether this host has what the VM driver `entry` needs to boot a guest, by
    the driver's own host checks (`Backend.probe`; the readiness probe boots none): `partial`
    if it does, else `unavailable` with the typed reason, `code: message`."""
    try:
        backend = registry.create(entry)
    except StockadeError as exc:
        return Row(name, UNAVAILABLE, entry.name, f"{exc.code}: {exc.message}")
    mechanism = backend.report()[0].mechanism
    try:
        backend.probe()
    except StockadeError as exc:
        return Row(name, UNAVAILABLE, mechanism, f"{exc.code}: {exc.message}")
    return Row(name, PARTIAL, mechanism,
               "the host has what a guest needs; the readiness probe boots none (a boot takes "
               "seconds): `stockade run --containment vm -- true` checks it")


def accepted(backend: Backend, name: str, spec: NetworkSpec | LimitSpec, mechanism: str,
             computed: Row | None = None, *, base: LaunchRequest = PLAIN_REQUEST) -> Row:
    """`computed`, unless the backend refuses `base` using the capability (then
    `unavailable`, with the backend's reason); `partial` if the probe has nothing to say."""
    field = "network" if isinstance(spec, NetworkSpec) else "limits"
    request = replace(base, **{field: spec})
    try:
        backend.check(request)
    except StockadeError as exc:
        return Row(name, UNAVAILABLE, computed.mechanism if computed else mechanism,
                   exc.message)
    return computed or Row(name, PARTIAL, mechanism,
                           "accepted by the backend, not verified by the readiness probe")


def _unverified(attestation: Attestation) -> str:
    if attestation.ready:
        return "not verified by the readiness probe"
    return f"not verified: the readiness probe failed ({attestation.reason})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
