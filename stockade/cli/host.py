"""What this host can do: `stockade demo`, `probe`, `report` and `reconcile`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.errors import EXIT_SETUP, StockadeError, UnavailableError
from stockade.launch import registry
from stockade.policy.model import ISOLATIONS


def add_demo(commands: Any) -> None:
    subcommand(commands, "demo", _demo,
               "try forbidden things inside a real sandbox and show each denial",
               "stockade demo")


def _demo(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade import demo  # imported on demand: it is the only user of its modules

    return demo.main()


def add_probe(commands: Any) -> None:
    probe = subcommand(commands, "probe", _probe,
                       "launch a throwaway sandbox, attest what it verified (exit 70: not ready)",
                       "stockade probe", "stockade probe --json")
    probe.add_argument("--json", action="store_true", help="print the attestation as JSON")
    probe.add_argument("--explain", action="store_true",
                       help="say what each fact is (with --json: a `legend` object, fact -> "
                            "line)")


def _probe(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.launch.probe import legend, probe

    attestation = probe()
    said = legend(attestation.backend) if args.explain and attestation.facts else {}
    if args.json:
        print(json.dumps(attestation.to_json() | ({"legend": said} if args.explain else {}),
                         indent=2))
    else:
        state = "ready" if attestation.ready else (
            f"NOT READY: {attestation.reason} at stage {attestation.stage}: "
            f"{attestation.message}")
        print(f"{attestation.backend}: {state} (run as {attestation.run_as}, "
              f"{attestation.duration_ms:.0f} ms)")
        for fact, value in attestation.facts.items():
            meaning = f"  -- {said[fact]}" if fact in said else ""
            print(f"  {fact}: {json.dumps(value)}{meaning}")
    return 0 if attestation.ready else EXIT_SETUP


def add_doctor(commands: Any) -> None:
    doctor = subcommand(commands, "doctor", _doctor,
                        "why the Linux backend is unavailable or weakened here, and the remedy "
                        "for each cause (exit 0 only when everything Stockade can use is "
                        "available)", "stockade doctor", "stockade doctor --json")
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def _doctor(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    if not sys.platform.startswith("linux"):
        raise UnavailableError("backend_unavailable", "stockade doctor diagnoses the Linux "
                               f"backend; this host is {sys.platform}: `stockade probe` says "
                               "what its backend lacks")
    from stockade.linux.doctor import diagnose

    found = diagnose()
    print(json.dumps(found.to_json(), indent=2) if args.json else found.text())
    return 0 if found.ok else 1


def add_report(commands: Any) -> None:
    report = subcommand(commands, "report", _report,
                        "what this host enforces, capability by capability, from a real probe",
                        "stockade report", "stockade report --json", "stockade report --markdown")
    shape = report.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON instead of a table")
    shape.add_argument("--markdown", action="store_true", help="print Markdown tables")
    report.add_argument("--isolation", choices=ISOLATIONS, default=ISOLATIONS[0],
                        help="report this isolation of the backend (landlock: the tier without "
                             "namespaces, what it enforces and what it does not)")


def _report(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.launch.manager import isolated
    from stockade.launch.probe import probe
    from stockade.launch.report import build

    reports = []
    native = registry.native()
    for entry in registry.entries(registry.NATIVE):
        try:
            backend = isolated(registry.create(entry), args.isolation)
        except StockadeError:
            continue  # another platform's, which cannot even be loaded here (or has no tier)
        attestation = probe(backend)
        if entry is native or attestation.ready:  # another platform's only if it runs here
            reports.append(build(attestation, backend))
    if args.json:
        print(json.dumps({"backends": [report.to_json() for report in reports]}, indent=2))
    elif args.markdown:
        print("\n".join(report.markdown() for report in reports), end="")
    else:
        print("\n\n".join(report.text() for report in reports))
    return 0


def add_reconcile(commands: Any) -> None:
    reconcile = subcommand(commands, "reconcile", _reconcile,
                           "remove what crashed launches left behind, as recorded in the "
                           "ledger, half-built change sets and the private homes of workspaces "
                           "that no longer exist; list the pending change sets",
                           "stockade reconcile", "stockade --state-dir /srv/stockade reconcile")
    reconcile.add_argument("--json", action="store_true", help="print a JSON summary")
    reconcile.add_argument("--revoke-runtime-grants", action="store_true",
                           help="also take back the standing grants on runtime roots (Windows: "
                                "read roots granted once for every later launch)")


def _reconcile(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from dataclasses import asdict

    from stockade.launch import registry
    from stockade.lifecycle.ledger import Ledger

    ledger = Ledger()
    registry.load_record_kinds()  # (the kinds of this host's backends, before any is read)
    done = ledger.reconcile()
    quarantined = ledger.quarantined()
    # Copy-on-write runs: a change set a crash left half-made never held a run's writes and
    # goes; a complete one is the owner's to review, apply or discard, never removed here.
    from stockade.lifecycle import changes

    half_built = changes.abandoned()
    kept = [{"id": s.id, "status": s.status, "roots": list(s.roots),
             "argv": list(s.meta.get("argv", []))} for s in changes.pending()]
    # Private homes of workspaces that are gone: nothing else would ever remove them.
    from stockade.lifecycle import homes, statedir

    keys = statedir.key_dir()
    gone_homes = homes.prune(keys) if keys else []
    revoked: list[str] = []
    unrevoked: list[str] = []
    if args.revoke_runtime_grants:
        from stockade.windows import standing

        revoked, unrevoked = standing.revoke_here()
    if args.json:
        print(json.dumps({**asdict(done), "quarantine": quarantined,
                          "quarantine_dir": ledger.quarantine_dir,
                          "changes_removed": half_built, "changes_pending": kept,
                          "homes_removed": gone_homes, "runtime_grants_revoked": revoked,
                          "runtime_grants_kept": unrevoked}))
    else:
        print(f"reconciled {done.reconciled} record(s), {len(done.removed)} resource(s) removed; "
              f"{done.live} live, {done.failed} to retry")
        for kind, name in done.removed:
            print(f"  removed {kind} {name}")
        for path in half_built:
            print(f"  removed unfinished change set {path}")
        for path in gone_homes:
            print(f"  removed the private home of a workspace that no longer exists: {path}")
        for path in revoked:
            print(f"  took back the standing grant on the runtime root {path}")
        for why in unrevoked:
            print(f"  kept a standing grant it could not take back: {why}")
        if quarantined:
            print(f"{len(quarantined)} record(s) in quarantine, readiness fails until they are "
                  f"inspected and deleted: {ledger.quarantine_dir}")
        if kept:
            print(f"{len(kept)} pending change set(s) of copy-on-write runs (review with "
                  "`stockade changes RUN`, then `stockade apply RUN` or `stockade discard RUN`):")
            for entry in kept:
                print(f"  {entry['id']}  {entry['status']:<11}  {' '.join(entry['roots'])}")
    return 1 if quarantined or done.failed or unrevoked else 0
