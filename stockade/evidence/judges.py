"""The child's side of a verdict: what the attack observed (its `name: outcome` lines) and how the
sandbox ended it, judged against what the row expects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from stockade.evidence.row import Launch
from stockade.evidence.scene import Scene
from stockade.evidence.watch import Finding
from stockade.launch.result import Result


@dataclass(frozen=True)
class Line:
    name: str
    outcome: str   # denied | ALLOWED | note
    detail: str


Judge = Callable[[Scene, Launch], Finding]


def lines(result: Result) -> list[Line]:
    """The attack's report lines (other output is ignored)."""
    out = []
    for text in result.stdout.decode("utf-8", "replace").splitlines():
        name, _, rest = text.partition(": ")  # names never hold ": ", details may
        outcome, _, detail = rest.partition(" ")
        if name and outcome in ("denied", "ALLOWED", "note"):
            out.append(Line(name, outcome, detail))
    return out


def notes(result: Result) -> dict[str, str]:
    return {line.name: line.detail for line in lines(result) if line.outcome == "note"}


def on_result(check: Callable[[Scene, Result], Finding]) -> Judge:
    """A judge from a check of the Result; a launch that raised fails the row."""
    def judge(scene: Scene, launch: Launch) -> Finding:
        if launch.result is None:
            return Finding(False, f"launch failed: {launch.error}")
        return check(scene, launch.result)
    return judge


def _tail(result: Result) -> str:
    text = result.stderr.decode("utf-8", "replace").strip().splitlines()
    return text[-1][:160] if text else "no stderr"


def all_denied(result: Result, expect: dict[str, str]) -> Finding:
    """No attempt ALLOWED, each denied as `expect` says (by name), and the attack complete."""
    report = lines(result)
    allowed = [f"{line.name} ({line.detail})" for line in report if line.outcome == "ALLOWED"]
    if allowed:
        return Finding(False, "ALLOWED: " + "; ".join(allowed))
    denied = [line for line in report if line.outcome == "denied"]
    wrong = [f"{line.name}: {line.detail}, expected {expect[line.name]}"
             for line in denied if line.name in expect and line.detail != expect[line.name]]
    if wrong:
        return Finding(False, "denied the wrong way: " + "; ".join(wrong))
    if result.exit_code != 0 or not denied:
        return Finding(False, f"the attack did not complete (status {result.exit_status}, "
                              f"{len(denied)} attempts): {_tail(result)}")
    counts = Counter(line.detail for line in denied)
    return Finding(True, f"{len(denied)} attempts denied ("
                   + ", ".join(f"{code}×{n}" for code, n in counts.most_common()) + ")")


def denials(expect: dict[str, str] | None = None) -> Judge:
    """Every attempt denied (with the errno given in `expect`, by attempt name), the attack ran
    to its end, and at least one attempt was made."""
    return on_result(lambda scene, result: all_denied(result, expect or {}))


def refused(code: str) -> Judge:
    """The launch was refused before anything ran, with the typed reason `code`."""
    def judge(scene: Scene, launch: Launch) -> Finding:
        if launch.error is not None and launch.error.code == code:
            return Finding(True, f"refused before launch: {code}")
        what = launch.error.code if launch.error else "it ran"
        return Finding(False, f"NOT refused with {code} ({what})")
    return judge


def bounded(note: str, limit: Callable[[], int], unit: str = "") -> Judge:
    """Every attempt denied, and the number the attack reports as `note` within `limit()`."""
    def check(scene: Scene, result: Result) -> Finding:
        base = all_denied(result, {})
        if not base.ok:
            return base
        reached, most = int(notes(result).get(note, "-1")), limit()
        within = 0 <= reached <= most
        return Finding(within, f"{base.text}; {note} {reached}{unit}, "
                               f"{'within' if within else 'BEYOND'} {most}{unit}")
    return on_result(check)


def ended_by(kind: str, within: float) -> Judge:
    """The sandbox was ended by Stockade (`limits.timeout` or `cancelled`), killed, in time."""
    def check(scene: Scene, result: Result) -> Finding:
        kinds = [v.kind for v in result.violations]
        ok = kind in kinds and result.signal is not None and result.duration <= within
        return Finding(ok, f"ended by {', '.join(kinds) or 'itself'} after "
                           f"{result.duration:.2f}s (at most {within:g}s), signal {result.signal}")
    return on_result(check)


def output_cut(limit: int) -> Judge:
    """Captured output stopped at `limit` bytes and was flagged."""
    def check(scene: Scene, result: Result) -> Finding:
        ok = result.stdout_truncated and len(result.stdout) == limit
        return Finding(ok, f"captured {len(result.stdout)} bytes of stdout (limit {limit}), "
                           f"truncated={result.stdout_truncated}")
    return on_result(check)


def completed(note: str) -> Judge:
    """The attack ran to its end and reported `note` (the host-side watches decide the rest)."""
    def check(scene: Scene, result: Result) -> Finding:
        ok = result.exit_code == 0 and note in notes(result)
        return Finding(ok, f"attack exited {result.exit_status}, {note}: "
                           f"{notes(result).get(note, 'not reported')}")
    return on_result(check)


def _truncation_denied(scene: Scene, result: Result) -> Finding:
    """The attempt to truncate was denied; what the output limit let through is the host
    side's to judge (AppendedFile)."""
    line = next((line for line in lines(result) if line.name.startswith("truncate")), None)
    if line is None:
        return Finding(False, f"the attack did not run: {_tail(result)}")
    if line.outcome != "denied":
        return Finding(False, f"ALLOWED: {line.name} ({line.detail})")
    return Finding(True, f"{line.name}: denied {line.detail}")


truncation_denied = on_result(_truncation_denied)

