"""The `stockade` command line (also `python -m stockade`).

    stockade run [--policy FILE | --preset NAME] [flags] -- argv...
    stockade sandbox-exec POLICY.json -- argv...
    stockade exec [--experimental] [--json] CONFIG.json     (docs/exec-config.md)
    stockade policy check FILE
    stockade policy show [--preset NAME | FILE] [--toml]
    stockade demo
    stockade probe [--json] [--explain]
    stockade report [--json | --markdown]
    stockade doctor [--json]
    stockade reconcile [--json]
    stockade fence install | uninstall | status [--json]   (Windows: the egress fence service)
    stockade changes [RUN] [--list] [--stat] [--json]   (a copy-on-write run's changes)
    stockade apply [RUN]; stockade discard [RUN]
    stockade evidence [--json | --markdown] [--only CATEGORY] [--allow-not-run]
    stockade proxy --allow PATTERN [--deny PATTERN] [--listen HOST:PORT] [--log FILE]
    stockade daemon [--socket PATH] [--idle SECONDS]
    stockade session start NAME [--policy FILE | --preset NAME] [--workspace DIR]
    stockade session exec NAME [--policy FILE | --preset NAME] [--workspace DIR] [--cwd DIR]
                          [--env K=V ...] [--timeout T] [--json] -- argv...
    stockade session stop NAME
    stockade session list [--json]
    stockade mcp [--policy FILE | --preset NAME] [--workspace DIR] [--http PORT]
    stockade serve --agent-sandbox [--policy FILE | --preset NAME] [--workspace DIR]
                   [--host ADDR [--allow-remote]] [--port PORT] [--max-upload BYTES]
    (every `session` action takes --socket PATH; default: the daemon's)

Exit codes:

| code     | meaning                                                                        |
| -------- | ------------------------------------------------------------------------------ |
| 0-255    | `run`, `sandbox-exec`, `exec`, `session exec`: the command's own exit status    |
| 128+N    | the command was killed by signal N (137 = SIGKILL, also after a timeout)        |
| 1        | `demo`: a forbidden attempt was not denied (or a permitted one was refused)     |
| 1        | `reconcile`: a record was quarantined, or a resource could not be removed yet   |
| 1        | `apply`: a change conflicts or may never land (each listed); `changes`, `apply`, |
|          | `discard`: no such pending run, or its run still goes on                        |
| 1        | `doctor`: something Stockade can use is unavailable here (it says why and how)  |
| 1        | `fence status`: the egress fence service does not answer (it says why)          |
| 1        | `evidence`: a row FAILed (the sandbox did not hold)                             |
| 1        | `session stop`: there was no session of that name                               |
| 3        | `evidence`: no row failed, but some could not run here (`--allow-not-run`)      |
| 2        | usage or policy error (bad flag, policy file or preset); nothing ran            |
| 70       | `mcp`: the `mcp` package is not installed (`extra_missing`)                     |
| 70       | the sandbox could not be set up here: unavailable, unenforceable, setup failed  |
|          | (`probe`: not ready; the attestation says why; `session`: no daemon, or the     |
|          | session failed: `daemon_unavailable`, `session_boot_failed`, ...)               |
| 71       | the sandbox was ready but the command could not be started (not found, ...)     |
| 130      | interrupted (Ctrl-C); the sandbox dies with Stockade (`session exec`: the       |
|          | command is cancelled in the session, which stays warm; 143 for SIGTERM)         |
| 141      | Stockade's own output was cut off (its reader closed the pipe)                  |
| 74       | Stockade's own output could not be written (`output_failed`: a full disk, ...);  |
|          | after `run` has run the command, its status is returned instead, or 74 if it    |
|          | was 0 and the command's own output could not be relayed                         |

A command may itself exit 2, 70 or 71; `--json` tells the cases apart (an `error` object, or a
result). Every Stockade error is one line on stderr: `stockade: <code>: <message>`.

`--state-dir DIR` (before the command) sets where the launch ledger lives, for this process
and its children, as `STOCKADE_STATE_DIR` does (see stockade/lifecycle/statedir.py).
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn

from stockade import __version__
from stockade.cli import (
    changes,
    execconfig,
    fence,
    host,
    mcp,
    policy,
    run,
    serve,
    session,
    tools,
)
from stockade.cli.common import EXIT_OUTPUT_FAILED, CommandLine, drop_stdout, epilog
from stockade.cli.policy import to_toml
from stockade.errors import StockadeError, UsageError

__all__ = ["COMMAND_LINE", "build_parser", "console_main", "main", "to_toml"]

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as if the shell's default disposition had applied
# How writing our stdout fails when it is full, gone or not writable (an error with no file
# name: a file Stockade opens itself names it).
OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF)
COMMAND_TAKERS = ("run", "sandbox-exec", "session exec")  # the commands that take `-- argv...`


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a UsageError (one stderr line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def console_main() -> int:
    """The `stockade` program. `run` and `sandbox-exec` are then a single-threaded process
    running one sandbox, which forks it directly instead of starting a zygote interpreter."""
    run.fork_directly = True
    return main()


def main(argv: Sequence[str] | None = None, *, only: Collection[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring). With `only`,
    a command not named in it is a usage error (the CLI server runs only what it serves)."""
    try:
        status = _command_line(argv, only)
        if sys.stdout is not None:  # (buffered output fails here, where it can be said)
            sys.stdout.flush()
        return status
    except BrokenPipeError:  # our reader went away (`stockade report | head`)
        drop_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        if exc.filename is not None or exc.errno not in OUTPUT_ERRORS:
            raise  # (not our output failing: a fault of Stockade's, shown as one)
        print(f"stockade: output_failed: what Stockade printed could not be written "
              f"({exc.strerror})", file=sys.stderr)
        drop_stdout()  # (nothing more)
        return EXIT_OUTPUT_FAILED


def _command_line(argv: Sequence[str] | None, only: Collection[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    head, command = _split_command(words)
    json_mode = False
    try:
        args = _parse(head, command)
        if only is not None and (args.command not in only or args.state_dir is not None):
            raise UsageError(f"the CLI server runs only {', '.join(only)}")
        json_mode = bool(getattr(args, "json", False))
        if args.state_dir is not None:
            from stockade.lifecycle import statedir

            if not args.state_dir:
                raise UsageError("--state-dir: an empty path (name a directory)")
            os.environ[statedir.ENV] = os.path.abspath(args.state_dir)
        args.command_line = COMMAND_LINE
        return args.handler(args, command)
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    except StockadeError as exc:
        return _fail(exc, json_mode)
    except KeyboardInterrupt:
        if json_mode:  # (before any result: a run's own Ctrl-C prints its cancelled result)
            try:
                print(json.dumps({"error": {"code": "interrupted", "message": "interrupted"}}),
                      flush=True)
            except OSError:
                drop_stdout()
        print("stockade: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _parse(head: list[str], command: list[str] | None) -> argparse.Namespace:
    args, extras = build_parser(_named(head)).parse_known_args(head)
    if extras:
        named = " ".join(filter(None, (args.command, getattr(args, "action", None))))
        missing_cut = command is None and named in COMMAND_TAKERS
        hint = " (put the command after '--')" if missing_cut else ""
        raise UsageError(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


@functools.cache
def build_parser(named: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command (the command after `--` is split off before parsing), or
    with `named` only for the command of that name (what parsing a command line that names it
    needs: `stockade run` starts faster without building the others); built once per process,
    as parsing leaves it unchanged."""
    parser = _Parser(prog="stockade", description="Run untrusted commands in a sandbox.",
                     epilog=epilog("stockade run -- make test", "stockade demo",
                                      "stockade report"),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="where the launch ledger lives (default: $STOCKADE_STATE_DIR, "
                             "else $XDG_STATE_HOME/stockade, /var/lib/stockade for root, "
                             "~/.local/state/stockade)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for names, add in ADDERS:
        if named is None or named in names:
            add(commands)
    return parser


# What adds each command to the parser, with the names it adds, in the order --help lists them.
ADDERS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("run",), run.add_run), (("sandbox-exec",), run.add_sandbox_exec),
    (("policy",), policy.add_policy), (("demo",), host.add_demo), (("probe",), host.add_probe),
    (("report",), host.add_report), (("doctor",), host.add_doctor),
    (("reconcile",), host.add_reconcile), (("fence",), fence.add_fence),
    (("changes", "apply", "discard"), changes.add_changes),
    (("evidence",), tools.add_evidence), (("proxy",), tools.add_proxy),
    (("agent",), tools.add_agent), (("daemon",), tools.add_daemon),
    (("session",), session.add_session), (("exec",), execconfig.add_exec),
    (("mcp",), mcp.add_mcp), (("serve",), serve.add_serve),
)


def _named(head: list[str]) -> str | None:
    """The command `head` names: its first word after `--state-dir DIR`, if that is a
    command's name; otherwise None (no command, --help, --version, an abbreviated option, a
    mistake: the whole parser says what it is)."""
    at = 0
    while at < len(head) and (head[at] == "--state-dir" or head[at].startswith("--state-dir=")):
        at += 1 if "=" in head[at] else 2
    word = head[at] if at < len(head) else None
    return word if any(word in names for names, _ in ADDERS) else None


COMMAND_LINE = CommandLine(main, build_parser)


def _split_command(words: list[str]) -> tuple[list[str], list[str] | None]:
    """Stockade's own arguments, and the command after the first `--` (None without one)."""
    if "--" not in words:
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1:]


def _fail(error: StockadeError, json_mode: bool) -> int:
    if json_mode:
        try:
            print(json.dumps({"error": {"code": error.code, "message": error.message}}),
                  flush=True)
        except OSError:  # (said on stderr either way)
            drop_stdout()
    print(f"stockade: {' '.join(str(error).splitlines())}", file=sys.stderr)
    return error.exit_code
