"""The evidence rows about what the allowlist proxy reads (network.credentials, network.http,
approvals; issue 34 item 5), each run on its own in this process with its positive control: a
few seconds each, so that tests/mutants.py can name a row as a test that a careless change to
the proxy must fail (tests/test_evidence.py runs the whole matrix, from the README's install).
"""

from __future__ import annotations

import pytest
from conftest import unavailable

from stockade.evidence.runner import run_matrix, select
from stockade.linux.backend import LinuxBackend

ROWS = ("net.credential-elsewhere", "net.credential-hidden", "net.credential-ca-key",
        "net.http-framing", "net.http-rules", "net.credential-guarded", "env.credential-secret",
        "fs.approval-write-outside")


@pytest.mark.parametrize("row_id", ROWS)
def test_the_row_passes_with_its_control(linux: None, row_id: str) -> None:
    (verdict,) = run_matrix(LinuxBackend(), select([row_id])).verdicts
    if verdict.status == "not-run":
        unavailable(f"{row_id}: {verdict.observed}")
    assert verdict.status == "pass", verdict.observed
    assert verdict.controlled, verdict.control
