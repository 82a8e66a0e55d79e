"""`stockade exec CONFIG.json`: run the command an execution config describes
(docs/exec-config.md; the mapping is stockade/launch/execconfig.py).

`processcontainer` runs exactly as `stockade run` does, in a fresh sandbox of the native
backend. `windows_sandbox` is VM containment and needs `--experimental`: on Linux a QEMU guest
(stockade/vm/qemu.py), whose output is relayed live as `stockade session exec` does.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from stockade.cli import run
from stockade.cli.common import no_command, subcommand
from stockade.errors import PolicyError, UnenforceableError, UsageError

if TYPE_CHECKING:
    from stockade.launch.execconfig import ExecConfig


def add_exec(commands: Any) -> None:
    parser = subcommand(commands, "exec", _exec,
                        "run the command of an execution config (see docs/exec-config.md)",
                        "stockade exec build.json",
                        "stockade exec --json build.json",
                        "stockade exec --experimental vm.json")
    parser.add_argument("config", metavar="CONFIG", help="an execution config file (JSON)")
    parser.add_argument("--experimental", action="store_true",
                        help='allow containment "windows_sandbox" (here: a QEMU virtual '
                             "machine, which boots in seconds)")
    parser.add_argument("--json", action="store_true",
                        help="capture output and print one JSON result (or error) object")


def _exec(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    # (here, not at the top: every other command, `stockade run` first, starts without it)
    from stockade.launch.execconfig import load_exec_config, located

    config = load_exec_config(args.config)
    if sys.platform == "win32":  # the command line would go to CreateProcessW verbatim
        raise UnenforceableError("exec.commandLine", "passing process.commandLine verbatim on "
                                 "Windows is not implemented yet")
    if config.containment != "processcontainer" and not args.experimental:
        raise UsageError(f'{args.config}: containment "windows_sandbox" is experimental; '
                         "pass --experimental to run it")
    try:
        if config.containment == "processcontainer":
            return run.run_sandboxed(config.policy, list(config.argv), None, as_json=args.json)
        return _run_in_vm(config, as_json=args.json)
    except PolicyError as exc:  # (compile's, before anything ran: at the config's own key)
        raise located(exc, args.config) from None


def _run_in_vm(config: ExecConfig, *, as_json: bool) -> int:
    ignored = config.windows_sandbox.given
    if ignored:
        print(f"stockade: note: experimental.windows_sandbox.{', '.join(ignored)} only apply "
              "to Windows Sandbox; ignored by the QEMU VM", file=sys.stderr)
    return run.run_sandboxed(config.policy, list(config.argv), None, as_json=as_json)
