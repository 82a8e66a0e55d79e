"""One row of the evidence matrix: an attack, the policy it runs under, its host-side setup, the
mechanism that must refuse it (data its judge checks), the switches that prove that mechanism
by making the row fail, and where its positive control runs."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from stockade.errors import StockadeError
from stockade.launch.result import Result

if TYPE_CHECKING:
    from stockade.evidence.judges import Expect
    from stockade.evidence.scene import Scene
    from stockade.evidence.setups import Setup
    from stockade.launch.backend import Backend

CATEGORIES = ("filesystem", "network", "process", "environment", "resources", "lifecycle",
              "helpers", "vm")


@dataclass(frozen=True)
class Launch:
    """How a row's launch ended: a Result, or the typed error that stopped it. A row with a
    launcher of its own may leave several results (`runs`) or other `facts` for its judge."""

    result: Result | None = None
    error: StockadeError | None = None
    runs: tuple[Result, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


Launcher = Callable[["Row", "Scene", "Backend"], Launch]


@dataclass(frozen=True)
class Condition:
    """Where a mutation proves its row: as root or rootless only (None: either), and only
    where a kernel knob (a /proc/sys path) has one of some values."""

    root: bool | None = None
    knob: str = ""
    values: tuple[str, ...] = ()

    def holds(self) -> bool:
        if self.root is not None and self.root != (os.getuid() == 0):
            return False
        return not self.knob or knob_value(self.knob) in self.values

    def describe(self) -> str:
        parts = [] if self.root is None else ["as root" if self.root else "rootless"]
        if self.knob:
            parts.append(f"{self.knob} in {'/'.join(self.values)}")
        return " and ".join(parts)


ALWAYS = Condition()
AS_ROOT = Condition(root=True)
ROOTLESS = Condition(root=False)


def knob_value(name: str) -> str:
    """A kernel knob under /proc/sys ("" when absent)."""
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Mutation:
    """Switches of the Linux backend (LinuxBackend(weaken=...)) which, off together, make the
    row fail; where `when` holds."""

    layers: frozenset[str]
    when: Condition = ALWAYS

    def describe(self) -> str:
        text = "+".join(sorted(self.layers))
        return f"{text} ({self.when.describe()})" if self.when != ALWAYS else text


def off(*layers: str, when: Condition = ALWAYS) -> Mutation:
    return Mutation(frozenset(layers), when)


@dataclass(frozen=True)
class Control:
    """Where the attack runs to show that it works when nothing refuses it: on the host with
    no sandbox (`weaken` empty), or in a sandbox with exactly `weaken` switched off. A control
    that must outlive a limit is ended by the runner after `deadline` seconds."""

    weaken: frozenset[str] = frozenset()
    deadline: float | None = None

    @property
    def on_host(self) -> bool:
        return not self.weaken

    def describe(self) -> str:
        where = "on the host" if self.on_host else \
            f"in a sandbox without {'+'.join(sorted(self.weaken))}"
        return where + (f", still running after {self.deadline:g}s" if self.deadline else "")


ON_HOST = Control()


def without(*layers: str, deadline: float | None = None) -> Control:
    return Control(frozenset(layers), deadline)


@dataclass(frozen=True)
class Row:
    id: str
    category: str
    attempt: str                 # what the malicious child tries
    attack: str                  # its program, a file in attacks/
    expect: Expect               # the mechanism that must refuse it, checked by its judge
    setup: Setup                 # the host's side: bait and watches
    args: tuple[str, ...] = ()   # the attack's arguments, with the scene's {placeholders}
    preset: str = "workspace-write"
    # Policy overrides; strings may hold the scene's placeholders too, as {scene:name}.
    policy: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    launch: Launcher | None = None   # None: the attack, run once under the row's policy
    proven_by: tuple[Mutation, ...] = ()
    unproven: str = ""           # why no switch can make the row fail, if none does
    control: Control | None = ON_HOST
    uncontrolled: str = ""       # why the attack cannot be shown to work anywhere, if so
    root_only: str = ""          # why the row means nothing rootless, if it does not
    isolation: str = "namespaces"  # the policy's isolation (the landlock tier: tier_rows.py)
    capability: str = ""         # the row of `stockade report` it attests (tier rows)

    def __post_init__(self) -> None:
        if not self.proven_by and not self.unproven:
            raise ValueError(f"row {self.id}: no mutation proves it, and it does not say why")
        if self.control is None and not self.uncontrolled:
            raise ValueError(f"row {self.id}: no positive control, and it does not say why")

    @property
    def expected(self) -> str:
        return self.expect.describe()

    def mutations(self) -> tuple[Mutation, ...]:
        """The mutations that prove this row on this host."""
        return tuple(m for m in self.proven_by if m.when.holds())
