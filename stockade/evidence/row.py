"""One row of the evidence matrix: an attack, the policy it runs under, its host-side setup, and
how its verdict is reached."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from stockade.errors import StockadeError
from stockade.launch.result import Result

if TYPE_CHECKING:
    from stockade.evidence.judges import Judge
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
class Row:
    id: str
    category: str
    attempt: str                 # what the malicious child tries
    expected: str                # what must happen instead
    attack: str                  # its program, a file in attacks/
    judge: Judge                 # the child's side of the verdict
    setup: Setup                 # the host's side: bait and watches
    args: tuple[str, ...] = ()   # the attack's arguments, with the scene's {placeholders}
    preset: str = "workspace-write"
    policy: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    launch: Launcher | None = None   # None: the attack, run once under the row's policy
    # A refusal code that is this row's expected outcome: the backend fails closed rather than
    # run the attack (the host-side checks must still hold).
    fails_closed_with: str = ""
