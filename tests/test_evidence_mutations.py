"""The mutation test of the evidence matrix, in each isolation: each layer switch the rows name
(rows.py and tier_rows.py `proven`) is switched off alone, and the rows it could touch — every
row that names one of its layers — run under it. Exactly the rows that declare the mutation (or
one within it) must FAIL; every other one must still pass, refused by a mechanism it names (a
second layer holds). A matrix whose rows cannot fail, or fail for another layer than they say,
would prove nothing.

Each mutation is one run of its rows, without positive controls (the evidence run has them),
four mutations at a time (each launch is a sandbox of its own; the host-side checks look only at
their own scene's processes and files), so each isolation's test takes about a minute or two.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import unavailable

from stockade.evidence.judges import NotEnforced, attempts
from stockade.evidence.row import Row
from stockade.evidence.rows import ROWS
from stockade.evidence.runner import Matrix, run_attack, run_matrix, scene_base
from stockade.evidence.testhost import global_address6
from stockade.evidence.tier_rows import TIER_LAYERS, rows_for
from stockade.launch.manager import isolated
from stockade.linux.backend import LinuxBackend
from stockade.linux.frame import WEAKENINGS, switched_off
from stockade.linux.net import routed_families
from stockade.policy.model import ISOLATIONS

ROOT = os.getuid() == 0


def runnable(row: Row) -> bool:
    return not (row.root_only and not ROOT) and row.category != "vm"


RUNNABLE = {isolation: tuple(row for row in rows_for(isolation) if runnable(row))
            for isolation in ISOLATIONS}
MUTATIONS = [(isolation, layers) for isolation in ISOLATIONS
             for layers in sorted({m.layers for row in RUNNABLE[isolation]
                                   for m in row.mutations()}, key=sorted)]


def touched(isolation: str, layers: frozenset[str]) -> tuple[Row, ...]:
    """The rows that name one of the layers off with `layers` in a mutation of theirs here."""
    off = switched_off(layers, isolation)
    return tuple(row for row in RUNNABLE[isolation]
                 if any(m.layers & off for m in row.mutations()))


def declared(isolation: str, layers: frozenset[str]) -> set[str]:
    """The rows that must fail with `layers` off: a mutation of theirs lies within what is
    off with them."""
    off = switched_off(layers, isolation)
    return {row.id for row in RUNNABLE[isolation]
            if any(m.layers <= off for m in row.mutations())}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_every_row_is_proven_or_says_why_not(isolation: str) -> None:
    honoured = WEAKENINGS if isolation == "namespaces" else TIER_LAYERS
    for row in rows_for(isolation):
        assert row.mutations() or row.unproven, row.id
        for mutation in row.proven_by:
            assert mutation.layers <= honoured, (row.id, mutation.layers - honoured)
        assert row.control is not None or row.uncontrolled, row.id
        if isinstance(row.expect, NotEnforced):  # (a gap is shown by its own run)
            assert not row.proven_by and row.control is None, row.id


def test_the_tier_honours_only_real_switches() -> None:
    assert TIER_LAYERS <= WEAKENINGS


# Switches no row can show, and why.
UNSHOWN = {
    "nosuid": "a set-user-id file runs with its owner's uid only where that uid is mapped in "
              "the sandbox's user namespace, and the only one mapped is the caller's own: the "
              "kernel ignores every other owner's bit, so nosuid is depth no attempt can show",
}


def test_every_switch_proves_a_row_or_says_why_not() -> None:
    named = {layer for isolation in ISOLATIONS for row in rows_for(isolation)
             for m in row.proven_by for layer in m.layers}
    assert WEAKENINGS - named == set(UNSHOWN), "a switch no row is proven by"


PARALLEL = 4  # mutations run at once (most of their time is waiting for a deadline)


# The one host-wide name these tests must own (the proxy's 127.0.0.1:3128 on the host's network)
# is taken under this lock, so another run of the suite (rootless beside root, another user) waits.
HOST_PORT_LOCK = "/tmp/stockade-tests-host-proxy-port.lock"


@contextlib.contextmanager
def host_port_lock() -> Iterator[None]:
    """Hold the lock on the host's proxy port, whoever made the lock file (read-only is enough
    for flock; it is made readable by every user)."""
    while True:
        try:
            fd = os.open(HOST_PORT_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            try:
                fd = os.open(HOST_PORT_LOCK, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_CLOEXEC,
                             0o444)
                os.fchmod(fd, 0o444)  # (whatever the umask)
                break
            except FileExistsError:
                continue
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def on_the_hosts_network(case: tuple[str, frozenset[str]]) -> bool:
    """Whether the mutation's sandboxes share the host's network namespace: their proxies
    then all listen on the host's 127.0.0.1:3128, so no two such mutations run at once."""
    isolation, layers = case
    return isolation == "namespaces" and "network" in switched_off(layers, isolation)


@pytest.fixture(scope="module")
def mutated(linux: None) -> dict[tuple[str, frozenset[str]], Matrix]:
    """Each mutation's run of the rows it touches (those on the host's network one after
    the other, in one of the workers)."""
    def run(case: tuple[str, frozenset[str]]) -> Matrix:
        isolation, layers = case
        backend = isolated(LinuxBackend(weaken=layers), isolation)
        return run_matrix(backend, touched(isolation, layers), controls=False)

    def in_turn(cases: list[tuple[str, frozenset[str]]]) -> list[Matrix]:
        with host_port_lock():
            return [run(case) for case in cases]
    shared = [case for case in MUTATIONS if on_the_hosts_network(case)]
    alone = [case for case in MUTATIONS if not on_the_hosts_network(case)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        together = pool.submit(in_turn, shared)
        results = dict(zip(alone, pool.map(run, alone), strict=True))
        results |= dict(zip(shared, together.result(), strict=True))
    return results


@pytest.mark.parametrize(("isolation", "layers"), MUTATIONS,
                         ids=lambda value: value if isinstance(value, str)
                         else "+".join(sorted(value)))
def test_a_switched_off_layer_fails_exactly_its_rows(
        mutated: dict[tuple[str, frozenset[str]], Matrix], isolation: str,
        layers: frozenset[str]) -> None:
    rows = touched(isolation, layers)
    matrix = mutated[isolation, layers]
    failed = {v.id for v in matrix.verdicts if v.status == "FAIL"}
    expected = declared(isolation, layers) & {row.id for row in rows}
    wrong = {v.id: f"{v.status}: {v.observed}" for v in matrix.verdicts
             if (v.id in expected) != (v.status == "FAIL") or v.status not in ("pass", "FAIL")}
    assert not wrong, wrong
    assert failed == expected


def test_each_form_of_the_guarded_destination_gets_through_with_the_guard_s_switch_off(
        linux: None) -> None:
    """net.any-guarded fails with its switch off for every attempt, not for one: each IPv6 form
    of the test host (as root its ULA, NAT64 and 6to4 forms; rootless the host's own IPv6
    address), the IPv4-mapped form and the host's link-local address reach their servers
    once it is off, so none of them is kept out by something the row does not name (no
    route, pasta)."""
    if 6 not in routed_families():
        unavailable("this host has no IPv6 default route: pasta gives the sandbox no IPv6")
    row = next(row for row in ROWS if row.id == "net.any-guarded")
    forms = {"{test_mapped}", "{test_link_local}"} | (
        {"{test_ula}", "{test_nat64}", "{test_6to4}"} if ROOT
        else {"{test_own6}"} if global_address6() else set())
    with tempfile.TemporaryDirectory(dir=scene_base()) as base:
        for mutation in row.mutations():
            seen, _ = run_attack(row, LinuxBackend(weaken=mutation.layers), Path(base),
                                 secrets.token_hex(4))
            assert seen.launch.result is not None, seen.launch.error
            made = {seen.name(line.name): line for line in attempts(seen.launch.result)}
            assert {form for form in forms if any(form in name for name in made)} == forms, \
                made
            refused = {name: line.detail for name, line in made.items()
                       if line.outcome != "ALLOWED"}
            assert not refused, (mutation.describe(), refused)
