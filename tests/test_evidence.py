"""`stockade evidence`, run here: every row asserted on its own (a failing row names itself,
an ERROR is no pass), with its positive control, and the generated document checked against the
current rows. Each layer switched off in turn: tests/test_evidence_mutations.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import unavailable

from stockade.errors import UnavailableError
from stockade.evidence.command import EXIT_FAILED, EXIT_INCOMPLETE, exit_status
from stockade.evidence.rows import ROWS
from stockade.evidence.runner import Matrix, Verdict, run_matrix, select
from stockade.linux.backend import LinuxBackend

TREE = Path(__file__).resolve().parent.parent
DOC = TREE / "docs" / "evidence-linux.md"
ROOT = os.getuid() == 0
IDS = [row.id for row in ROWS]


@pytest.fixture(scope="module")
def evidence_run(linux: None, readme_checkout, tmp_path_factory) -> tuple[Matrix, int]:
    """`stockade evidence --json` as a user runs it: from the README's install (not editable,
    tests/checkout.py), so that a file it needs but the package lacks fails its row; the
    matrix and the exit status."""
    done = subprocess.run([str(readme_checkout.bin / "stockade"), "evidence", "--json"],
                          capture_output=True, text=True, timeout=600,
                          cwd=tmp_path_factory.mktemp("evidence"))
    assert done.stdout, done.stderr
    return Matrix.from_json(json.loads(done.stdout)), done.returncode


@pytest.fixture(scope="module")
def matrix(evidence_run: tuple[Matrix, int]) -> Matrix:
    return evidence_run[0]


def test_the_command_exits_as_its_rows_say(evidence_run: tuple[Matrix, int]) -> None:
    matrix, status = evidence_run
    assert status == exit_status(matrix, allow_not_run=False)


# Rows whose layer exists only as root (the kernel lets only host root set it): rootless the
# report must not claim the layer.
ROOT_ONLY_FEATURES = {"fs.memfd-exec": "filesystem.memfd_exec"}
ROOT_ONLY = {row.id: row.root_only for row in ROWS if row.root_only}


@pytest.mark.parametrize("row_id", IDS)
def test_row(matrix: Matrix, row_id: str) -> None:
    """Each row passes, with its positive control and (where a switch can) its proof; a row
    that means nothing rootless says so, not-run with its reason."""
    verdict = next(v for v in matrix.verdicts if v.id == row_id)
    row = next(row for row in ROWS if row.id == row_id)
    if row_id in ROOT_ONLY and not ROOT:
        assert verdict.status == "not-run" and ROOT_ONLY[row_id] in verdict.observed
        if row_id in ROOT_ONLY_FEATURES:
            report = {c.name: c for c in LinuxBackend().report()}
            assert not report[ROOT_ONLY_FEATURES[row_id]].enforced
        return
    if verdict.status == "not-run":
        unavailable(f"{row_id}: {verdict.verdict}")
    assert verdict.status == "pass", f"{row_id}: {verdict.observed}"
    assert verdict.controlled or row.uncontrolled, f"{row_id}: {verdict.control}"
    assert verdict.mutations or row.unproven, row_id


def test_the_matrix_runs_every_row(matrix: Matrix) -> None:
    assert [v.id for v in matrix.verdicts] == IDS  # (its duration is bench/'s to measure)


def document_table() -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of the document's `## Rows` table."""
    table = DOC.read_text().split("\n## Rows\n", 1)[1]
    lines = [line.strip() for line in table.splitlines() if line.startswith("|")]

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip("|"))]

    header = cells(lines[0])
    return header, [dict(zip(header, cells(line), strict=True)) for line in lines[2:]]


def test_the_document_lists_exactly_the_current_rows() -> None:
    _, rows = document_table()
    assert [row["id"].strip("`") for row in rows] == IDS, \
        "regenerate it: python3 scripts/evidence_doc.py"


def test_the_document_shows_this_runs_verdicts(matrix: Matrix) -> None:
    header, rows = document_table()
    column = "root" if ROOT else "rootless"
    assert column in header, f"the document has no {column} run"
    documented = {row["id"].strip("`"): row[column] for row in rows}
    assert documented == {v.id: v.verdict for v in matrix.verdicts}, \
        "regenerate it: python3 scripts/evidence_doc.py"


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


def test_the_command_refuses_an_unknown_category() -> None:
    done = evidence_cli("--only", "nonsense")
    assert done.returncode == 2
    assert "nonsense" in done.stderr
