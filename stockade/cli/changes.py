"""`stockade changes`, `apply` and `discard`: the pending changes of copy-on-write runs
(`filesystem.workspace = "overlay"`, `stockade run --overlay`), reviewed, then applied to the
real workspace or dropped (stockade/lifecycle/changes.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.errors import ChangesError


def add_changes(commands: Any) -> None:
    changes = subcommand(commands, "changes", _changes,
                         "list what a copy-on-write run changed, with a diff of text files",
                         "stockade changes", "stockade changes 3f9a --stat",
                         "stockade changes --list")
    changes.add_argument("run", nargs="?", metavar="RUN",
                         help="the run's id or a unique prefix of it (default: the newest)")
    changes.add_argument("--list", action="store_true", help="list every pending run instead")
    changes.add_argument("--stat", action="store_true", help="the changed paths, no diff")
    changes.add_argument("--json", action="store_true", help="print one JSON object")
    apply = subcommand(commands, "apply", _apply,
                       "apply a copy-on-write run's changes to the real workspace (refused "
                       "whole, exit 1, if the workspace changed on the host meanwhile)",
                       "stockade apply", "stockade apply 3f9a")
    apply.add_argument("run", nargs="?", metavar="RUN", help="the run (default: the newest)")
    apply.add_argument("--home-config", action="store_true",
                       help="also land changes to the home directory itself, its hidden "
                            "entries (start-up files, configuration, ~/.local), ~/bin and the "
                            "user site-packages, refused otherwise: host programs run them")
    discard = subcommand(commands, "discard", _discard,
                         "drop a copy-on-write run's changes", "stockade discard 3f9a")
    discard.add_argument("run", nargs="?", metavar="RUN", help="the run (default: the newest)")


def _changes(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.launch.result import summary
    from stockade.lifecycle import changes, changeview

    if args.list:
        listed = []
        for s in changes.pending():
            try:
                listed.append((s, s.changes()))
            except ChangesError as exc:  # (changes_broken: said, and the others still listed)
                listed.append((s, exc))
        if args.json:
            print(json.dumps([summary(s, found) if isinstance(found, list) else
                              {"id": s.id, "status": "broken",
                               "error": {"code": found.code, "message": found.message}}
                              for s, found in listed]))
        for s, found in [] if args.json else listed:
            argv = changeview.visible(" ".join(s.meta["argv"]))
            if isinstance(found, ChangesError):
                print(f"{s.id}  {'broken':<11}  {found.code}: {found.message}")
            else:
                print(f"{s.id}  {s.status:<11}  {_counts(found)}  {argv}")
        return 0
    chosen = changes.load(args.run)
    found = chosen.changes()  # (one scan: the list and the diff show the same changes)
    if args.json:
        print(json.dumps(summary(chosen, found) | {"diff": chosen.diff(found)}))
        return 0
    print(f"run {chosen.id} ({chosen.status}): {_counts(found)}")
    for change in found:
        print(f"  {changeview.line(change)}")
    if not args.stat:
        sys.stdout.write(chosen.diff(found))
    return 0


def _counts(found: list) -> str:
    counts = [f"{sum(c.kind == kind for c in found)} {kind}"
              for kind in ("added", "modified", "deleted")]
    unshown = sum(c.kind == "unshown" for c in found)
    return ", ".join(counts + ([f"{unshown} not shown (apply refuses)"] if unshown else []))


def _apply(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.lifecycle import changes

    chosen = changes.load(args.run)
    try:
        applied = chosen.apply(home_config=args.home_config)
    except ChangesError as exc:
        print(f"stockade: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"applied run {chosen.id}: {_counts(applied)}")
    return 0


def _discard(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.lifecycle import changes

    chosen = changes.load(args.run)
    chosen.discard()
    print(f"discarded run {chosen.id}")
    return 0
