"""How the readiness probe judges the facts it observes: each platform's probe has a table,
stage -> fact -> check (the test, and the expectation it states: stockade/linux/probe.py,
stockade/windows/probe.py). `judge` names the first stage whose facts do not hold; the report
asks `verified` about the facts each capability rests on.
"""

from __future__ import annotations

from collections.abc import Callable

PROBE_MEMORY, PROBE_PIDS = 512 << 20, 32  # every platform's probe sandbox runs under these

Check = tuple[Callable[[object], bool], str]  # the test, and what it expects (for messages)


class NotEnforced(Exception):
    """A fact of `stage` does not hold."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


Table = dict[str, dict[str, Check]]  # stage -> fact -> its check


def judge(facts: dict[str, object], table: Table) -> None:
    """Raise NotEnforced for the first stage with a fact that does not hold."""
    for stage, checks in table.items():
        for fact, (accept, expected) in checks.items():
            value = facts.get(fact)
            if not accept(value):
                raise NotEnforced(stage, f"{fact}: observed {value!r}, expected {expected}")


def verified(facts: dict[str, object], *names: str, table: Table) -> bool:
    """Whether each named fact is present and holds its check in `table`."""
    checks = {fact: accept for stage in table.values()
              for fact, (accept, _) in stage.items()}
    return all(name in facts and name in checks and checks[name](facts[name])
               for name in names)


def exactly(wanted: object) -> Check:
    """A check that a fact is `wanted`, of the same type (True is not 1)."""
    return (lambda value: type(value) is type(wanted) and value == wanted), repr(wanted)


def equal(wanted: object) -> Check:
    """A check that a fact equals `wanted`."""
    return (lambda value: value == wanted), repr(wanted)


def refused(value: object) -> bool:
    """Whether an attempt's outcome is an error (an errno name), not "ok"."""
    return isinstance(value, str) and value != "ok"
