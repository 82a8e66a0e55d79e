"""`stockade evidence`, run here: every row asserted on its own (a failing row names itself),
the generated document checked against the current rows, and each layer switched off in turn to
show that the matching rows FAIL — a matrix that cannot fail would prove nothing.
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


# Rows whose layer exists only as root (the kernel lets only host root set it): rootless, the
# row must say so (not-run, with the reason) and the report must not claim the layer.
ROOT_ONLY = {"fs.memfd-exec": "filesystem.memfd_exec"}


@pytest.mark.parametrize("row_id", IDS)
def test_row(matrix: Matrix, row_id: str) -> None:
    verdict = next(v for v in matrix.verdicts if v.id == row_id)
    if row_id in ROOT_ONLY and not ROOT:
        report = {c.name: c for c in LinuxBackend().report()}
        assert verdict.status == "not-run" and "only host root" in verdict.observed
        assert not report[ROOT_ONLY[row_id]].enforced
        return
    if verdict.status == "not-run":
        unavailable(f"{row_id}: {verdict.verdict}")
    assert verdict.status == "pass", f"{row_id}: {verdict.observed}"


def test_the_matrix_runs_within_two_minutes(matrix: Matrix) -> None:
    assert [v.id for v in matrix.verdicts] == IDS
    assert matrix.seconds < 120


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


def knob(name: str) -> str:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return ""


def rows_of(*categories: str, but: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(row.id for row in select(categories) if row.id not in but)


# Rows that FAIL without any weakening (see docs/evidence-linux.md) are left out of these runs.
FILESYSTEM = rows_of("filesystem", but=() if ROOT else tuple(ROOT_ONLY))
NETWORK = rows_of("network", but=tuple(row.id for row in ROWS if "allowlist" in row.id))
SECCOMP_ROWS = {"proc.ptrace", "proc.user-namespace", "proc.clone3", "proc.keyctl",
                "proc.userfaultfd"} \
    | ({"proc.tty-injection"} if knob("dev/tty/legacy_tiocsti") == "1" else set()) \
    | ({"proc.perf-event"} if knob("kernel/perf_event_paranoid") in ("-1", "0", "1", "2")
       else set()) \
    | ({"proc.io-uring"} if knob("kernel/io_uring_disabled") in ("", "0") else set())

WEAKENINGS = [
    # seccomp alone: kernel knobs still refuse bpf; mount needs capabilities too.
    pytest.param({"seccomp"}, rows_of("process"), SECCOMP_ROWS, id="seccomp"),
    # Landlock alone: the empty network namespace and the mounts cover everything but TCP bind.
    pytest.param({"landlock"}, FILESYSTEM + NETWORK, {"net.listen"}, id="landlock"),
    pytest.param({"privileges"}, rows_of("process"), {"proc.capabilities"}, id="privileges"),
    # A read root mounted read-write: Landlock still refuses writes, but it has no right for
    # chmod, so that gets through; without Landlock too, everything does.
    pytest.param({"read_only"}, FILESYSTEM, {"fs.write-read-root"}, id="read_only"),
    pytest.param({"read_only", "landlock"}, FILESYSTEM,
                 {"fs.write-read-root", "fs.proc-fd-reopen", "fs.truncate-read-only"},
                 id="read_only+landlock"),
    # Landlock cannot express an exception inside a granted root: protected names and denied
    # paths rest on the mount layer alone.
    pytest.param({"protected"}, FILESYSTEM,
                 {"fs.protected-dir", "fs.protected-file", "fs.protected-rename",
                  "fs.git-pointers", "fs.git-absent", "fs.hardlink"}, id="protected"),
    pytest.param({"deny"}, FILESYSTEM + rows_of("environment"),
                 {"fs.deny-in-root", "env.home-credentials", "fs.deny-whole-tree"}, id="deny"),
    # seccomp is the one layer for privilege bits and for address families.
    pytest.param({"seccomp"}, ("fs.privilege-bits", "net.address-families"),
                 {"fs.privilege-bits", "net.address-families"}, id="seccomp-files-sockets"),
    pytest.param({"unix_sockets"}, NETWORK, {"net.unix-in-write-root"}, id="unix_sockets"),
    # Stockade's own helpers: the state directory's mask, and the servers' peer check.
    pytest.param({"stockade_state"}, rows_of("helpers"), {"helpers.state-dir"},
                 id="stockade_state"),
    pytest.param({"peer_check"}, rows_of("helpers"), {"helpers.servers"}, id="peer_check"),
    # The caller's own streams handed to the command instead of relayed through pipes.
    pytest.param({"stdio_relay"}, ("proc.caller-terminal", "res.output-to-a-file"),
                 {"proc.caller-terminal", "res.output-to-a-file"}, id="stdio_relay"),
    # A case-folding filesystem is refused for any protected or denied file on it; with neither
    # layer, nothing is refused and every other spelling reaches the files.
    pytest.param({"protected", "deny"}, ("fs.case-alias",), {"fs.case-alias"},
                 id="protected+deny"),
    # The host's network: Landlock still refuses TCP and abstract sockets, not UDP.
    pytest.param({"network"}, NETWORK,
                 {"net.udp-loopback", "net.dns-loopback", "net.test-host"}, id="network"),
    pytest.param({"network", "landlock"}, NETWORK,
                 {"net.udp-loopback", "net.dns-loopback", "net.test-host", "net.tcp-loopback",
                  "net.listen", "net.unix-abstract"}, id="network+landlock"),
    *([pytest.param({"memfd_noexec"}, FILESYSTEM, {"fs.memfd-exec"}, id="memfd_noexec")]
      if ROOT else []),
    # As root, the sandbox pid namespace's pid_max still bounds the fork bomb.
    pytest.param({"rlimits"}, rows_of("resources"),
                 {"res.memory-bomb", "res.disk-fill"} | (set() if ROOT else {"res.fork-bomb"}),
                 id="rlimits"),
    # Root's capabilities inside its user namespace open the new mount API and chroot.
    pytest.param({"privileges", "seccomp"}, rows_of("process"),
                 SECCOMP_ROWS | {"proc.capabilities"} | ({"proc.mount"} if ROOT else set()),
                 id="privileges+seccomp"),
]


@pytest.mark.parametrize(("weaken", "rows", "failing"), WEAKENINGS)
@pytest.mark.usefixtures("linux")
def test_a_weakened_layer_makes_its_rows_fail(weaken: set[str], rows: tuple[str, ...],
                                              failing: set[str]) -> None:
    matrix = run_matrix(LinuxBackend(weaken=frozenset(weaken)), select(rows))
    failed = {v.id for v in matrix.verdicts if v.status == "FAIL"}
    details = {v.id: v.observed for v in matrix.verdicts if v.id in failed ^ failing}
    assert failed == failing, details
    assert not matrix.count("not-run")


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
    assert "2 passed, 0 failed, 0 not run" in done.stderr


def test_the_command_refuses_an_unknown_category() -> None:
    done = evidence_cli("--only", "nonsense")
    assert done.returncode == 2
    assert "nonsense" in done.stderr
