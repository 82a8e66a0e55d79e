"""`stockade fence install | uninstall | status`: the egress fence service on Windows
(stockade/windows/fenceinstall.py, docs/windows.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.errors import UnavailableError


def add_fence(commands: Any) -> None:
    fence = subcommand(commands, "fence", None,
                       "Windows: the elevated service behind network allowlist and any "
                       "(loopback exemptions and WFP filters per launch)",
                       "stockade fence install", "stockade fence status --json")
    actions = fence.add_subparsers(dest="action", required=True, metavar="ACTION")
    subcommand(actions, "install", _install, "install and start the service (as an "
               "administrator, from an interpreter only administrators can change)")
    subcommand(actions, "uninstall", _uninstall, "stop the service, which takes every fence "
               "back, and remove it (as an administrator)")
    status = subcommand(actions, "status", _status, "whether the service answers here "
                        "(exit 1 if not)")
    status.add_argument("--json", action="store_true", help="print the answer as JSON")


def _windows() -> None:
    if sys.platform != "win32":
        raise UnavailableError("backend_unavailable", "the fence service runs on Windows only")


def _install(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    _windows()
    from stockade.windows import fenceinstall

    fenceinstall.install()
    print("the fence service is installed and answers: network allowlist and any are "
          "available to Windows launches")
    return 0


def _uninstall(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    _windows()
    from stockade.windows import fenceinstall

    fenceinstall.uninstall()
    print("the fence service is stopped and removed")
    return 0


def _status(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    _windows()
    from stockade.windows import fenceclient

    why = fenceclient.helper_refusal()
    if args.json:
        print(json.dumps({"answers": why is None, "reason": why or ""}))
    else:
        print(why or "the fence service answers")
    return 0 if why is None else 1
