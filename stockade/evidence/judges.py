"""The child's side of a verdict: what the attack observed (its `name: outcome` lines) and how the
sandbox ended it, judged against the mechanism the row expects — data, not prose.

Three outcomes: pass (every attempt refused by a mechanism the row names), FAIL (an attempt
worked: an escape), ERROR (nothing was shown: the attack did not start or finish, a tool was
missing, an attempt was refused by something the row does not name). Each expectation also
says how its positive control is judged: the same attack, where nothing refuses it, must work.
"""

from __future__ import annotations

import abc
import signal
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from stockade.evidence.row import Launch, Row
from stockade.evidence.scene import Scene
from stockade.evidence.watch import Finding
from stockade.launch.result import Result

OUTCOMES = ("denied", "ALLOWED", "note", "error")


@dataclass(frozen=True)
class Line:
    name: str
    outcome: str   # denied | ALLOWED | note | error
    detail: str


def lines(result: Result) -> list[Line]:
    """The attack's report lines (other output is ignored)."""
    out = []
    stdout = result.stdout if isinstance(result.stdout, bytes) else b""
    for text in stdout.decode("utf-8", "replace").splitlines():
        name, _, rest = text.partition(": ")  # names never hold ": ", details may
        outcome, _, detail = rest.partition(" ")
        if name and outcome in OUTCOMES:
            out.append(Line(name, outcome, detail))
    return out


def notes(result: Result) -> dict[str, str]:
    return {line.name: line.detail for line in lines(result) if line.outcome == "note"}


def attempts(result: Result) -> list[Line]:
    return [line for line in lines(result) if line.outcome in ("denied", "ALLOWED")]


def error(text: str) -> Finding:
    return Finding(False, text, error=True)


def tail(result: Result) -> str:
    stderr = result.stderr if isinstance(result.stderr, bytes) else b""
    text = stderr.decode("utf-8", "replace").strip().splitlines()
    return text[-1][:160] if text else "no stderr"


def incomplete(result: Result) -> Finding | None:
    """ERROR when the attack did not run to its end or reported it could not try."""
    broken = [f"{line.name} ({line.detail})" for line in lines(result) if line.outcome == "error"]
    if broken:
        return error("the attack could not try: " + "; ".join(broken))
    if result.exit_code != 0:
        return error(f"the attack did not complete (status {result.exit_status}): "
                     f"{tail(result)}")
    return None


def escapes(result: Result) -> Finding | None:
    """FAIL when any attempt worked."""
    allowed = [f"{line.name} ({line.detail})" for line in lines(result)
               if line.outcome == "ALLOWED"]
    return Finding(False, "ALLOWED: " + "; ".join(allowed)) if allowed else None


def worked_everywhere(result: Result, attempted: Mapping[str, str],
                      name: Callable[[str], str]) -> Finding:
    """A control: where nothing refuses the attack, it ran to its end, at least one of the
    attempts the sandboxed run made (`attempted`: normalised name -> the code it was refused
    with; all attempts if empty) worked, and none failed the way the sandbox refused it: an
    attempt that fails the same way without the layer shows nothing of the layer. (An attempt
    may fail here otherwise: an earlier one that worked changed what it aims at.)"""
    broken = incomplete(result)
    if broken is not None:
        return Finding(False, broken.text)
    made = {name(line.name): line for line in attempts(result)}
    aimed = {n: line for n, line in made.items() if n in attempted or not attempted}
    worked = [n for n, line in aimed.items() if line.outcome == "ALLOWED"]
    same = [f"{n} ({line.detail})" for n, line in aimed.items()
            if line.outcome == "denied" and attempted.get(n) == line.detail]
    if same:
        return Finding(False, "failed here as in the sandbox: " + "; ".join(same))
    if not worked:
        return Finding(False, "no attempt worked: " + ("; ".join(
            f"{n} ({line.detail})" for n, line in aimed.items()) or "none made"))
    otherwise = len(aimed) - len(worked)
    return Finding(True, f"{len(worked)} of {len(attempted) or len(made)} attempts worked"
                         + (f", {otherwise} failed otherwise" if otherwise else ""))


@dataclass(frozen=True)
class Refusal:
    """A mechanism's answer: `layer` (a switch of the backend, or the kernel check that
    answers when the rest is off) refuses with one of `errnos` the attempts whose names start
    with `attempts` (every attempt: "")."""

    layer: str
    errnos: tuple[str, ...]
    attempts: str = ""


def refused_by(layer: str, *errnos: str, attempts: str = "") -> Refusal:
    return Refusal(layer, errnos, attempts)


class Expect(abc.ABC):
    """What must happen instead of the attack working, as data its judge checks."""

    @abc.abstractmethod
    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        """The child's side of the sandboxed run."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The row's "expected" column."""

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Callable[[str], str]) -> Finding:
        """The positive control: the attack, where nothing refuses it, worked (ok)."""
        if launch.result is None:
            return Finding(False, f"the control could not launch: {launch.error}")
        return worked_everywhere(launch.result, attempted, name)

    def refused_with(self, code: str) -> bool:
        """Whether a launch refused with `code` before it ran is what this row expects."""
        return False


@dataclass(frozen=True)
class Denied(Expect):
    """Every attempt refused, each with an errno one of `by` answers for it, and the attack
    ran to its end having made at least one attempt."""

    by: tuple[Refusal, ...]

    def errnos_for(self, attempt: str) -> dict[str, list[str]]:
        """errno -> the layers that answer `attempt` with it."""
        found: dict[str, list[str]] = {}
        for refusal in self.by:
            if attempt.startswith(refusal.attempts):
                for code in refusal.errnos:
                    found.setdefault(code, []).append(refusal.layer)
        return found

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        if launch.result is None:
            return error(f"the launch failed: {launch.error}")
        return self.check(launch.result)

    def check(self, result: Result) -> Finding:
        escaped = escapes(result)
        if escaped is not None:
            return escaped
        broken = incomplete(result)
        if broken is not None:
            return broken
        denied = [line for line in lines(result) if line.outcome == "denied"]
        if not denied:
            return error("the attack made no attempt")
        wrong, layers = [], Counter()
        for line in denied:
            answers = self.errnos_for(line.name)
            if line.detail in answers:
                layers[f"{line.detail}: {'/'.join(answers[line.detail])}"] += 1
            else:
                wrong.append(f"{line.name}: {line.detail}, expected "
                             f"{'/'.join(answers) or 'no refusal at all'}")
        if wrong:
            return error("refused by a mechanism the row does not name: " + "; ".join(wrong))
        return Finding(True, f"{len(denied)} attempts denied ("
                       + ", ".join(f"{what} ×{n}" for what, n in layers.most_common()) + ")")

    def describe(self) -> str:
        parts = []
        for refusal in self.by:
            where = f"{refusal.attempts}…: " if refusal.attempts else ""
            parts.append(f"{where}{'/'.join(refusal.errnos)} ({refusal.layer})")
        return "every attempt denied: " + "; ".join(parts)


@dataclass(frozen=True)
class Bounded(Denied):
    """Denied, and the number the attack reports as `note` within `limit()`."""

    note: str = ""
    limit: Callable[[], int] = lambda: 0
    unit: str = ""

    def check(self, result: Result) -> Finding:
        base = super().check(result)
        if not base.ok:
            return base
        reached, most = self.reached(result), self.limit()
        if reached < 0:
            return error(f"the attack did not report {self.note}")
        within = reached <= most
        return Finding(within, f"{base.text}; {self.note} {reached}{self.unit}, "
                               f"{'within' if within else 'BEYOND'} {most}{self.unit}")

    def reached(self, result: Result) -> int:
        try:
            return int(notes(result).get(self.note, "-1"))
        except ValueError:
            return -1

    def describe(self) -> str:
        return f"{super().describe()}; {self.note} at most the limit"

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Callable[[str], str]) -> Finding:
        if launch.result is None:
            return Finding(False, f"the control could not launch: {launch.error}")
        reached, most = self.reached(launch.result), self.limit()
        return Finding(reached > most, f"{self.note} {reached}{self.unit} "
                                       f"({'beyond' if reached > most else 'NOT beyond'} "
                                       f"{most}{self.unit})")


@dataclass(frozen=True)
class ProxyRefused(Denied):
    """Denied (the proxy's 403 is EACCES to the attack), and the proxy's own log holds a
    denial for each destination with one of `reasons`: the rule the row tests decided."""

    reasons: tuple[str, ...] = ()

    def check(self, result: Result) -> Finding:
        base = super().check(result)
        if not base.ok:
            return base
        decided = [f"{d.get('host')}:{d.get('port')} {d.get('reason')}"
                   for d in result.network_log]
        expected = [d for d in result.network_log if d.get("reason") in self.reasons]
        if not expected or len(expected) != len(result.network_log):
            return error(f"the proxy decided otherwise than by {'/'.join(self.reasons)}: "
                         f"{'; '.join(decided) or 'no decision logged'}")
        return Finding(True, f"{base.text}; the proxy logged {'; '.join(decided)}")

    def describe(self) -> str:
        return f"{super().describe()}; the proxy's log says {'/'.join(self.reasons)}"


@dataclass(frozen=True)
class Logged(Denied):
    """Denied, and each attempt refused with one of `silent` (a time-out: nothing answered,
    which alone shows no refusal) has a denial of its destination in the network log: the
    mechanism says it refused it. Attempts name their destination `PROTO HOST:PORT`, as
    attacks/net_connect.py does."""

    silent: tuple[str, ...] = ()

    def check(self, result: Result) -> Finding:
        base = super().check(result)
        if not base.ok:
            return base
        logged = {(d.get("protocol"), d.get("host"), d.get("port")) for d in result.network_log
                  if d.get("decision") == "deny"}
        silent = [line.name for line in lines(result)
                  if line.outcome == "denied" and line.detail in self.silent]
        unlogged = [name for name in silent if destination(name) not in logged]
        if unlogged:
            return error("no answer, and no denial logged: " + "; ".join(unlogged))
        return Finding(True, base.text + (f"; {len(silent)} unanswered, each denial logged"
                                          if silent else ""))

    def describe(self) -> str:
        return f"{super().describe()}; {'/'.join(self.silent)} only with the denial logged"


@dataclass(frozen=True)
class Recorded(Denied):
    """Denied, and a violation of `kind` recorded for each attempt the layer `recorder`
    denied (an errno of its refusal): the mechanism says what it refused (pid 1's name watch
    records each name it does not make; a read-only mount records nothing)."""

    kind: str = ""
    recorder: str = "names_watch"

    def check(self, result: Result) -> Finding:
        base = super().check(result)
        if not base.ok:
            return base
        denied = sum(line.outcome == "denied" and self.recorder in
                     self.errnos_for(line.name).get(line.detail, ()) for line in lines(result))
        recorded = sum(v.kind == self.kind for v in result.violations)
        if recorded < denied:
            return error(f"{denied} attempts denied by {self.recorder}, but {recorded} "
                         f"{self.kind} recorded")
        return Finding(True, f"{base.text}; {recorded} recorded {self.kind}")

    def describe(self) -> str:
        return f"{super().describe()}; each {self.recorder} denial recorded {self.kind}"


def destination(name: str) -> tuple[str, str, int | None]:
    """(protocol, address, port) of an attempt named `PROTO HOST:PORT` (dns-udp is udp; an
    IPv6 HOST in brackets, its zone dropped), as the network log records a destination."""
    proto, _, where = name.partition(" ")
    host, _, port = where.rpartition(":")
    return (proto.rpartition("-")[2], host.strip("[]").partition("%")[0],
            int(port) if port.isdigit() else None)


@dataclass(frozen=True)
class EndedBy(Expect):
    """The sandbox ended by Stockade (`kind`: limits.timeout, cancelled), killed with SIGKILL
    within `within` seconds."""

    kind: str
    within: float

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        result = launch.result
        if result is None:
            return error(f"the launch failed: {launch.error}")
        kinds = [v.kind for v in result.violations]
        text = (f"ended by {', '.join(kinds) or 'itself'} after {result.duration:.2f}s "
                f"(at most {self.within:g}s), signal {result.signal}")
        if launch.facts.get("watchdog"):
            return Finding(False, f"NOT ended in time: the runner's watchdog killed it; {text}")
        if result.signal is None:
            return error(f"the attack ended by itself: {text}")
        ok = self.kind in kinds and result.signal == signal.SIGKILL \
            and result.duration <= self.within
        return Finding(ok, text)

    def describe(self) -> str:
        return f"{self.kind}: SIGKILL within {self.within:g}s"

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Callable[[str], str]) -> Finding:
        ran = bool(launch.facts.get("watchdog"))
        return Finding(ran, "still running at the control's deadline" if ran
                       else f"ended before the control's deadline: {launch.result}")


@dataclass(frozen=True)
class OutputCut(Expect):
    """The captured output stopped at `limit` bytes and was flagged (limits.output)."""

    limit: int

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        result = launch.result
        if result is None:
            return error(f"the launch failed: {launch.error}")
        size = len(result.stdout or b"")
        text = f"captured {size} bytes of stdout (limit {self.limit}), " \
               f"truncated={result.stdout_truncated}"
        if size > self.limit:
            return Finding(False, text)
        flagged = "limits.output" in [v.kind for v in result.violations]
        if not (result.stdout_truncated and size == self.limit and flagged):
            return error(f"the flood did not reach the limit: {text}")
        return Finding(True, text)

    def describe(self) -> str:
        return f"limits.output: capture cut at {self.limit} bytes and flagged (output_cap)"

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Callable[[str], str]) -> Finding:
        size = len(launch.result.stdout or b"") if launch.result is not None else 0
        return Finding(size > self.limit, f"{size} bytes came out")


@dataclass(frozen=True)
class Completed(Expect):
    """The attack ran to its end and reported `note`: the host-side watches (`watched`) are
    the mechanism's evidence."""

    note: str
    watched: str

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        result = launch.result
        if result is None:
            return error(f"the launch failed: {launch.error}")
        if result.exit_code != 0 or self.note not in notes(result):
            return error(f"the attack did not complete (status {result.exit_status}, "
                         f"{self.note}: {notes(result).get(self.note, 'not reported')})")
        return Finding(True, f"attack completed, {self.note}: {notes(result)[self.note]}")

    def describe(self) -> str:
        return f"host side: {self.watched}"

    def worked(self, launch: Launch, host: Sequence[Finding],
               attempted: Mapping[str, str], name: Callable[[str], str]) -> Finding:
        hit = [f.text for f in host if not f.ok and not f.error]
        return Finding(bool(hit), "; ".join(hit) or "the host side saw nothing")


@dataclass(frozen=True)
class RefusedBefore(Expect):
    """The launch refused before anything ran, with the typed reason `code` (from the policy
    compiler, or the backend failing closed), or one of `also` (a second refusal that holds
    when the first is switched off); the host-side checks must hold."""

    code: str
    also: tuple[str, ...] = ()

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        if launch.error is not None and launch.error.code in (self.code, *self.also):
            return Finding(True, f"refused before launch: {launch.error.code}")
        if launch.result is not None:
            return escapes(launch.result) or error(
                f"NOT refused with {self.code}: it ran ({launch.result.exit_status}), and "
                "what stopped it is no mechanism of this row's")
        return error(f"refused otherwise than with {self.code}: {launch.error}")

    def describe(self) -> str:
        return f"the launch refused: {self.code}"

    def refused_with(self, code: str) -> bool:
        return code in (self.code, *self.also)


@dataclass(frozen=True)
class NotEnforced(Expect):
    """What the row attacks is not enforced by the isolation it runs in, as the row of the
    enforcement report named `capability` says: the policy is refused, typed (`refused`), or
    the attack runs and at least one attempt works there (the gap is shown, not assumed; one
    refused everywhere means the report is out of date). Its verdict is `not-enforced`, never
    a pass."""

    capability: str
    refused: str = ""

    def judge(self, row: Row, scene: Scene, launch: Launch) -> Finding:
        if self.refused:
            if launch.error is not None and launch.error.code == self.refused:
                return Finding(True, f"the policy is refused: {self.refused}")
            return error(f"expected the refusal {self.refused}, but "
                         f"{launch.error or 'it ran'}")
        if launch.result is None:
            return error(f"the launch failed: {launch.error}")
        shown = worked_everywhere(launch.result, {}, str)
        if not shown.ok:
            return error(f"the report says {self.capability} is not enforced here, but "
                         f"{shown.text}: is the report out of date?")
        return Finding(True, f"not enforced ({self.capability}): {shown.text}")

    def describe(self) -> str:
        how = f"the policy refused, {self.refused}" if self.refused else "the attack works"
        return f"not enforced here ({how}), as the report's {self.capability} says"

    def refused_with(self, code: str) -> bool:
        return code == self.refused
