"""The mutation test of the evidence matrix: each layer switch the rows name (rows.py `proven`)
is switched off alone, and the rows it could touch — every row that names one of its layers —
run under it. Exactly the rows that declare the mutation (or one within it) must FAIL; every
other one must still pass, refused by a mechanism it names (a second layer holds). A matrix
whose rows cannot fail, or fail for another layer than they say, would prove nothing.

Each mutation is one run of its rows, without positive controls (the evidence run has them),
four mutations at a time (each launch is a sandbox of its own; the host-side checks look only at
their own scene's processes and files), so the whole test takes about a minute or two here.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from stockade.evidence.row import Row
from stockade.evidence.rows import ROWS
from stockade.evidence.runner import Matrix, run_matrix
from stockade.linux.backend import LinuxBackend
from stockade.linux.frame import WEAKENINGS, switched_off

ROOT = os.getuid() == 0


def runnable(row: Row) -> bool:
    return not (row.root_only and not ROOT) and row.category != "vm"


RUNNABLE = tuple(row for row in ROWS if runnable(row))
MUTATIONS = sorted({m.layers for row in RUNNABLE for m in row.mutations()}, key=sorted)


def touched(layers: frozenset[str]) -> tuple[Row, ...]:
    """The rows that name one of the layers off with `layers` in a mutation of theirs here."""
    off = switched_off(layers)
    return tuple(row for row in RUNNABLE if any(m.layers & off for m in row.mutations()))


def declared(layers: frozenset[str]) -> set[str]:
    """The rows that must fail with `layers` off: a mutation of theirs lies within what is
    off with them."""
    off = switched_off(layers)
    return {row.id for row in RUNNABLE if any(m.layers <= off for m in row.mutations())}


def test_every_row_is_proven_or_says_why_not() -> None:
    for row in ROWS:
        assert row.mutations() or row.unproven, row.id
        for mutation in row.proven_by:
            assert mutation.layers <= WEAKENINGS, (row.id, mutation.layers - WEAKENINGS)
        assert row.control is not None or row.uncontrolled, row.id


# Switches no row can show, and why.
UNSHOWN = {
    "nosuid": "a set-user-id file runs with its owner's uid only where that uid is mapped in "
              "the sandbox's user namespace, and the only one mapped is the caller's own: the "
              "kernel ignores every other owner's bit, so nosuid is depth no attempt can show",
}


def test_every_switch_proves_a_row_or_says_why_not() -> None:
    named = {layer for row in ROWS for m in row.proven_by for layer in m.layers}
    assert WEAKENINGS - named == set(UNSHOWN), "a switch no row is proven by"


PARALLEL = 4  # mutations run at once (most of their time is waiting for a deadline)


@pytest.fixture(scope="module")
def mutated(linux: None) -> dict[frozenset[str], Matrix]:
    """Each mutation's run of the rows it touches."""
    def run(layers: frozenset[str]) -> Matrix:
        return run_matrix(LinuxBackend(weaken=layers), touched(layers), controls=False)
    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(MUTATIONS, pool.map(run, MUTATIONS), strict=True))


@pytest.mark.parametrize("layers", MUTATIONS, ids=lambda layers: "+".join(sorted(layers)))
def test_a_switched_off_layer_fails_exactly_its_rows(
        mutated: dict[frozenset[str], Matrix], layers: frozenset[str]) -> None:
    rows = touched(layers)
    matrix = mutated[layers]
    failed = {v.id for v in matrix.verdicts if v.status == "FAIL"}
    expected = declared(layers) & {row.id for row in rows}
    wrong = {v.id: f"{v.status}: {v.observed}" for v in matrix.verdicts
             if (v.id in expected) != (v.status == "FAIL") or v.status not in ("pass", "FAIL")}
    assert not wrong, wrong
    assert failed == expected
