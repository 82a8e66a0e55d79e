"""The enforcement report: computed from the probe's facts and the backend's refusals, in
text, JSON and Markdown; and the committed docs/enforcement-linux.md matches this host."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import stockade
from stockade.cli import main
from stockade.launch import report
from stockade.lifecycle.ledger import Ledger
from stockade.linux.backend import LinuxBackend

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "enforcement-linux.md"
CAPABILITIES = [
    "namespaces", "privileges", "landlock", "seccomp",
    "filesystem.read", "filesystem.write", "filesystem.deny", "filesystem.protected",
    "filesystem.git", "filesystem.exec_from_write", "filesystem.metadata",
    "filesystem.memfd_exec", "filesystem.privilege_bits", "filesystem.workspace",
    "stockade_state",
    "network.none", "network.tcp", "network.udp", "network.dns", "network.loopback",
    "network.link_local", "network.unix_sockets", "network.address_families",
    "network.inherited_sockets",
    "network.allowlist", "network.any",
    "env", "limits.memory", "limits.pids", "limits.file_size", "limits.cpu", "limits.timeout",
    "limits.output", "kill_on_close", "nested_namespaces", "host_processes", "ptrace",
    "tty_injection",
    "containment.vm",
]
linux = pytest.mark.usefixtures("linux")


@pytest.fixture(scope="module")
def here(tmp_path_factory) -> report.Report:
    backend = LinuxBackend()
    ledger = Ledger(str(tmp_path_factory.mktemp("state") / "state"))
    return report.build(stockade.probe(backend, ledger), backend)


def statuses(built: report.Report) -> dict[str, str]:
    return {row.name: row.status for row in built.rows}


@linux
def test_every_capability_of_the_policy_language_has_a_row(here):
    assert [row.name for row in here.rows] == CAPABILITIES
    assert all(row.status in ("enforced", "partial", "unavailable") and row.mechanism
               for row in here.rows)
    assert all(row.reason for row in here.rows if row.status != "enforced")


@linux
def test_statuses_on_this_host(here):
    got = statuses(here)
    root = os.geteuid() == 0
    assert got["filesystem.read"] == got["filesystem.write"] == "enforced"
    assert got["filesystem.deny"] == "enforced" and got["filesystem.protected"] == "partial"
    assert got["filesystem.git"] == "partial"
    assert got["network.none"] == got["network.tcp"] == got["network.loopback"] == "enforced"
    assert got["network.unix_sockets"] == "partial"
    assert got["filesystem.privilege_bits"] == got["stockade_state"] == "enforced"
    assert got["network.address_families"] == "enforced"
    assert got["filesystem.memfd_exec"] == "enforced"  # (rootless too: pid 1's memfd watch)
    assert got["limits.memory"] == "partial" and got["limits.file_size"] == "enforced"
    assert got["limits.pids"] == ("partial" if root else "enforced")
    assert got["privileges"] == ("partial" if root else "enforced")
    assert got["kill_on_close"] == got["nested_namespaces"] == got["tty_injection"] == "enforced"
    rows = {row.name: row for row in here.rows}
    # A refusal is the backend's own, with its reason (no delegated cgroup v2 cpu controller).
    assert got["limits.cpu"] == "unavailable" and "cgroup" in rows["limits.cpu"].reason
    assert "ABI" in rows["landlock"].mechanism
    assert "the command creates" in rows["filesystem.git"].reason


@linux
def test_a_weakened_layer_changes_the_report(tmp_path):
    backend = LinuxBackend(weaken=frozenset({"landlock"}))
    built = report.build(stockade.probe(backend, Ledger(str(tmp_path / "s"))), backend)
    got = statuses(built)
    assert not built.attestation.ready
    assert got["filesystem.read"] == got["filesystem.exec_from_write"] == "partial"
    assert got["landlock"] == "unavailable"
    assert "not in force here: landlock" in {r.name: r for r in built.rows}[
        "filesystem.read"].reason
    assert built.heading().startswith("linux: NOT READY (landlock_not_enforced")


def test_nothing_unverified_is_enforced():
    backend = LinuxBackend()
    failed = stockade.Attestation(
        ready=False, backend="linux", run_as="rootless", versions={}, facts={}, enforced={},
        timings={}, duration_ms=0.0, reason="userns_unavailable", stage="launch",
        message="user namespaces cannot be created here")
    built = report.build(failed, backend)
    assert all(row.status != "enforced" for row in built.rows)
    assert {r.name: r for r in built.rows}["env"].reason == (
        "not verified: the readiness probe failed (userns_unavailable)")
    # no Landlock ABI is claimed that the probe never saw
    assert {r.name: r for r in built.rows}["landlock"].mechanism == "Landlock (not observed)"


@linux
def test_renderings(here):
    text = here.text()
    assert text.splitlines()[0] == here.heading()
    assert all(name in text for name in CAPABILITIES)
    body = here.to_json()
    assert body["name"] == "linux" and body["ready"] is True
    assert [row["name"] for row in body["capabilities"]] == CAPABILITIES
    assert all(row["enforced"] == (row["status"] == "enforced") for row in body["capabilities"])
    markdown = here.markdown()
    assert markdown.count("\n| `") == len(CAPABILITIES)


@linux
def test_report_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    assert main(["report", "--json"]) == 0
    (linux_json,) = json.loads(capsys.readouterr().out)["backends"]
    assert linux_json["ready"] and len(linux_json["capabilities"]) == len(CAPABILITIES)
    assert main(["report", "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("### linux: ready")
    assert main(["report", "--json", "--markdown"]) == 2


@linux
def test_the_committed_document_matches_this_host(here):
    """docs/enforcement-linux.md holds one section per privilege mode, regenerated by
    scripts/enforcement_doc.py; the one for this run's mode must be what the probe reports
    here. The versions line is left out of the comparison (a patch-level kernel or Python
    upgrade changes no row)."""
    mode = "root" if os.geteuid() == 0 else "rootless"
    found = re.search(rf"<!-- report: {mode} -->\n(.*?)<!-- /report: {mode} -->",
                      DOC.read_text(), re.DOTALL)
    assert found, f"no {mode} section in {DOC}: run scripts/enforcement_doc.py"

    def rows(markdown: str) -> list[str]:
        return [line for line in markdown.splitlines() if not line.startswith("Versions:")]

    assert rows(found.group(1)) == rows(here.markdown()), (
        f"{DOC.name} is stale: run scripts/enforcement_doc.py")


def test_vm_containment_is_unavailable_without_qemu(monkeypatch):
    from stockade.vm import qemu

    monkeypatch.setattr(qemu.shutil, "which", lambda name: None)
    row = report.containment_row()
    assert (row.status, row.reason) == ("unavailable", "vm_qemu_unavailable: "
                                                      "qemu-system-x86_64 is not installed")
