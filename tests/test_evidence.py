"""`stockade evidence`, run here, in each isolation (the namespaces and the landlock tier):
every row asserted on its own (a failing row names itself, an ERROR is no pass), with its
positive control, and the generated documents checked against the current rows; in the tier,
each row not enforced agrees with the tier's enforcement report, row for row. Each layer
switched off in turn: tests/test_evidence_mutations.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import unavailable

from stockade.errors import UnavailableError
from stockade.evidence.command import EXIT_FAILED, EXIT_INCOMPLETE, exit_status
from stockade.evidence.judges import NotEnforced
from stockade.evidence.rows import ROWS
from stockade.evidence.runner import Matrix, Verdict, run_matrix, select
from stockade.evidence.tier_rows import rows_for
from stockade.evidence.watch import HelperGroup, group_processes
from stockade.linux.backend import LinuxBackend
from stockade.policy.model import ISOLATIONS

TREE = Path(__file__).resolve().parent.parent
DOCS = {"namespaces": TREE / "docs" / "evidence-linux.md",
        "landlock": TREE / "docs" / "evidence-landlock.md"}
ROOT = os.getuid() == 0
IDS = [row.id for row in ROWS]
CASES = [(isolation, row.id) for isolation in ISOLATIONS for row in rows_for(isolation)]
Run = Callable[[str], tuple[Matrix, int]]


@pytest.fixture(scope="module")
def evidence_run(linux: None, readme_checkout, tmp_path_factory) -> Run:
    """`stockade evidence --isolation ISOLATION --json` as a user runs it: from the README's
    install (not editable, tests/checkout.py), so that a file it needs but the package lacks
    fails its row, with the credentials extra its network.credentials rows need (README
    step 1 installs no extra: without it they are not run, and say so); the matrix and the
    exit status (each isolation run once, when first asked for)."""
    runs: dict[str, tuple[Matrix, int]] = {}

    def run(isolation: str) -> tuple[Matrix, int]:
        if not runs:
            extra = subprocess.run([str(readme_checkout.bin / "pip"), "install", "-q",
                                    ".[credentials]"], cwd=readme_checkout.root,
                                   capture_output=True, text=True, timeout=600)
            assert extra.returncode == 0, extra.stderr
        if isolation not in runs:
            done = subprocess.run(
                [str(readme_checkout.bin / "stockade"), "evidence", "--json", "--isolation",
                 isolation], capture_output=True, text=True, timeout=600,
                cwd=tmp_path_factory.mktemp("evidence"))
            assert done.stdout, done.stderr
            runs[isolation] = Matrix.from_json(json.loads(done.stdout)), done.returncode
        return runs[isolation]
    return run


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_command_exits_as_its_rows_say(evidence_run: Run, isolation: str) -> None:
    matrix, status = evidence_run(isolation)
    assert status == exit_status(matrix, allow_not_run=False)


@pytest.mark.parametrize(("isolation", "row_id"), CASES)
def test_row(evidence_run: Run, isolation: str, row_id: str) -> None:
    """Each row passes, with its positive control and (where a switch can) its proof, or, in
    the landlock tier, is shown not enforced there; a row that means nothing rootless says so,
    not-run with its reason."""
    matrix, _ = evidence_run(isolation)
    verdict = next(v for v in matrix.verdicts if v.id == row_id)
    row = next(row for row in rows_for(isolation) if row.id == row_id)
    if row.root_only and not ROOT:
        assert verdict.status == "not-run" and row.root_only in verdict.observed
        return
    if verdict.status == "not-run":
        unavailable(f"{row_id}: {verdict.verdict}")
    if isinstance(row.expect, NotEnforced):
        assert verdict.status == "not-enforced", f"{row_id}: {verdict.observed}"
        return
    assert verdict.status == "pass", f"{row_id}: {verdict.observed}"
    assert verdict.controlled or row.uncontrolled, f"{row_id}: {verdict.control}"
    assert verdict.mutations or row.unproven, row_id


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_matrix_runs_every_row(evidence_run: Run, isolation: str) -> None:
    matrix, _ = evidence_run(isolation)  # (its duration is bench/'s to measure)
    assert [v.id for v in matrix.verdicts] == [row.id for row in rows_for(isolation)]


def test_the_tier_runs_every_row_but_the_guests() -> None:
    assert [row.id for row in rows_for("landlock")] == [row.id for row in ROWS
                                                         if row.category != "vm"]


def test_the_tier_and_its_report_agree_row_for_row(evidence_run: Run, readme_checkout) -> None:
    """Each tier row names the row of `stockade report --isolation landlock` it attests: a row
    that passes, one the report calls enforced (or partial); a row not enforced, one the
    report calls unavailable (or partial), and its reason says why."""
    matrix, _ = evidence_run("landlock")
    done = subprocess.run([str(readme_checkout.bin / "stockade"), "report", "--isolation",
                           "landlock", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["backends"]
    assert report["name"] == "linux-landlock" and report["ready"], report
    said = {row["name"]: row for row in report["capabilities"]}
    for verdict in matrix.verdicts:
        assert verdict.capability in said, verdict.id
        status = said[verdict.capability]["status"]
        if verdict.status == "pass":
            assert status in ("enforced", "partial"), (verdict.id, said[verdict.capability])
        elif verdict.status == "not-enforced":
            assert status in ("unavailable", "partial"), (verdict.id, said[verdict.capability])
            assert said[verdict.capability]["reason"], verdict.id


def document_table(isolation: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of the isolation's document's `## Rows` table."""
    table = DOCS[isolation].read_text().split("\n## Rows\n", 1)[1]
    lines = [line.strip() for line in table.splitlines() if line.startswith("|")]

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))]

    header = cells(lines[0])
    return header, [dict(zip(header, cells(line), strict=True)) for line in lines[2:]]


REGENERATE = {"namespaces": "regenerate it: python3 scripts/evidence_doc.py",
              "landlock": "regenerate it: python3 scripts/evidence_doc.py --isolation landlock"}


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_document_lists_exactly_the_current_rows(isolation: str) -> None:
    _, rows = document_table(isolation)
    assert [row["id"].strip("`") for row in rows] == [row.id for row in rows_for(isolation)], \
        REGENERATE[isolation]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_document_shows_this_runs_verdicts(evidence_run: Run, isolation: str) -> None:
    matrix, _ = evidence_run(isolation)
    header, rows = document_table(isolation)
    column = "root" if ROOT else "rootless"
    assert column in header, f"the document has no {column} run"
    documented = {row["id"].strip("`"): row[column] for row in rows}
    assert documented == {v.id: v.verdict for v in matrix.verdicts}, REGENERATE[isolation]


class Unavailable(LinuxBackend):
    def probe(self) -> None:
        raise UnavailableError("userns_unavailable", "no user namespaces here")


def test_an_unavailable_backend_runs_nothing_and_says_why() -> None:
    matrix = run_matrix(Unavailable(), select(["process"]))
    assert {v.verdict for v in matrix.verdicts} == {"not-run: userns_unavailable"}
    assert exit_status(matrix, allow_not_run=False) == EXIT_INCOMPLETE
    assert exit_status(matrix, allow_not_run=True) == 0


def test_a_failed_row_fails_the_run_even_with_not_run_allowed() -> None:
    failed = Verdict("x", "process", "a", "b", "FAIL", "ALLOWED", 0.0)
    matrix = Matrix((failed,), 0.0, {})
    assert exit_status(matrix, allow_not_run=True) == EXIT_FAILED


def evidence_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stockade", "evidence", *args],
                          capture_output=True, text=True, cwd=TREE,
                          env={**os.environ, "PYTHONPATH": str(TREE)})


@pytest.mark.usefixtures("linux")
def test_the_command_prints_json_and_the_total_time() -> None:
    done = evidence_cli("--only", "proc.clone3", "--only", "env.home", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert [row["id"] for row in document["rows"]] == ["proc.clone3", "env.home"]
    assert document["passed"] == 2 and document["seconds"] > 0
    assert [row["mutations"] for row in document["rows"]] == [["seccomp"], ["landlock+mount_view"]]
    assert document["proven"] == document["controlled"] == 2
    assert "2 passed, 0 failed, 0 errors, 0 not run; 2 proven, 2 controlled" in done.stderr


@pytest.mark.usefixtures("linux")
def test_the_command_counts_rows_on_a_terminal_while_json_waits_for_the_end() -> None:
    """Issue 32: a run takes minutes; with the rows printed only at the end (--json), a
    terminal on stderr is told each one as it is done."""
    master, slave = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "stockade", "evidence", "--only",
                               "proc.clone3", "--only", "env.home", "--json"],
                              stdout=subprocess.PIPE, stderr=slave, text=True, cwd=TREE,
                              env={**os.environ, "PYTHONPATH": str(TREE)}, timeout=300)
        os.close(slave)
        slave = -1
        seen = b""
        with contextlib.suppress(OSError):  # (EIO: every writer has gone)
            while chunk := os.read(master, 4096):
                seen += chunk
    finally:
        os.close(master)
        if slave != -1:
            os.close(slave)
    assert done.returncode == 0, seen
    lines = seen.decode().splitlines()
    assert lines[:2] == ["stockade: evidence: 1/2 pass proc.clone3",
                         "stockade: evidence: 2/2 pass env.home"], lines
    assert json.loads(done.stdout)["passed"] == 2


def test_the_command_refuses_an_unknown_category() -> None:
    done = evidence_cli("--only", "nonsense")
    assert done.returncode == 2
    assert "nonsense" in done.stderr


@pytest.mark.parametrize("stubborn", [False, True])
def test_a_helper_a_row_ended_leaves_nothing_or_is_a_survivor(stubborn: bool) -> None:
    """A host helper of a row (evidence/watch.py HelperGroup: helpers.servers' CLI server)
    ends with its whole group; a process of the group that outlives the end (a child that
    ignores SIGTERM, as a served request's child outlives a terminated server) is reported
    SURVIVED, and killed: a row no longer says "no survivors" while its helper runs on."""
    child = "(trap '' TERM; exec sleep 300)" if stubborn else "sleep 300"
    helper = HelperGroup(subprocess.Popen(["sh", "-c", f"{child} & exec sleep 300"],
                                          start_new_session=True), "the helper")
    try:
        deadline = time.monotonic() + 10
        # (both have become `sleep`: the stubborn one has set its signal disposition first)
        while [_comm(pid) for pid in group_processes(helper.process.pid)] != \
                ["sleep", "sleep"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_processes(helper.process.pid)) == 2
        helper.end()
        found = helper.finish()
        assert found.ok is not stubborn, found.text
        assert ("SURVIVED" in found.text) is stubborn
        assert group_processes(helper.process.pid) == []
    finally:
        helper.close()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""
