"""`stockade session start|exec|stop|list`: the daemon's named warm sandboxes, from the shell.

Each call is one request to `stockade daemon` (stockade/session/daemon.py) through
`DaemonClient`. A session is keyed by its name and runs one policy and workspace: `exec` on a
running session must name the same `--policy`/`--preset` and `--workspace` as the `start` (or
the `exec`) that booted it, else `session_mismatch`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from stockade.cli.common import (
    add_policy_source,
    cancelled_by_signals,
    chosen_policy,
    env_flags,
    need_command,
    no_command,
    subcommand,
)
from stockade.cli.run import finish
from stockade.errors import UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.env import close_environment
from stockade.launch.result import Result
from stockade.policy import Policy
from stockade.policy.units import parse_duration

if TYPE_CHECKING:
    from stockade.session.client import DaemonClient
    from stockade.session.exchange import Output

# Stdin travels in the one request line (at most the daemon's MAX_REQUEST, base64-encoded).
MAX_INPUT = 4 << 20
EXIT_NO_SESSION = 1


def add_session(commands: Any) -> None:
    session = subcommand(commands, "session", None,
                         "run commands in the daemon's named warm sandboxes",
                         "stockade session start build --preset workspace-write",
                         "stockade session exec build --preset workspace-write -- make test",
                         "stockade session list", "stockade session stop build")
    actions = session.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = subcommand(actions, "start", _start, "boot a named session now (exec then finds it "
                       "warm)", "stockade session start build --preset workspace-write")
    _add_source(start)
    run = subcommand(actions, "exec", _exec,
                     "run a command in a named session (booted first if needed), output live",
                     "stockade session exec build -- make",
                     "stockade session exec build --cwd sub --env CI=1 --timeout 90s -- make test",
                     "git diff | stockade session exec review --policy stdin.toml -- wc -l",
                     takes_command=True)
    _add_source(run)
    run.add_argument("--cwd", metavar="DIR",
                     help="the command's working directory (default: the policy's, else the "
                          "workspace); relative: to the current directory")
    run.add_argument("--env", metavar="K=V", action="append", default=[],
                     help="add a variable to the policy's closed environment (repeatable)")
    run.add_argument("--timeout", metavar="T",
                     help='wall-clock limit for this command, such as "90s" or 5 (seconds)')
    run.add_argument("--json", action="store_true",
                     help="capture output and print one JSON result (or error) object")
    stop = subcommand(actions, "stop", _stop, "end a named session and everything in it",
                      "stockade session stop build")
    _add_name(stop)
    listing = subcommand(actions, "list", _list, "show the daemon's sessions",
                         "stockade session list", "stockade session list --json")
    _add_socket(listing)
    listing.add_argument("--json", action="store_true", help="print one JSON array")


def _add_socket(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH",
                        help="the daemon's control socket (default: daemon.sock in the state "
                             "directory)")


def _add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the session's name")
    _add_socket(parser)


def _add_source(parser: argparse.ArgumentParser) -> None:
    _add_name(parser)
    add_policy_source(parser)


def _start(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    policy, workspace = _source(args, ["true"], cwd=None)
    _client(args).start(args.name, policy=policy, workspace=workspace)
    print(f"stockade: session {args.name!r} is ready", file=sys.stderr)
    return 0


def _exec(args: argparse.Namespace, command: list[str] | None) -> int:
    argv = need_command(command, "session exec")
    cwd = None if args.cwd is None else os.path.abspath(args.cwd)
    policy, workspace = _source(args, argv, cwd=cwd)
    env = _environment(args.env)
    timeout = _timeout(args.timeout)
    data = stdin_input(policy.process.stdin)
    with cancelled_by_signals() as stopped:
        events = _client(args).stream(
            args.name, argv, policy=policy, workspace=workspace, cwd=cwd, env=env,
            timeout=timeout, input=data, cancel=stopped)
        status = relay(events, as_json=args.json)
    return status if stopped.signum is None else 128 + stopped.signum


def _stop(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    if _client(args).stop(args.name):
        print(f"stockade: session {args.name!r} stopped", file=sys.stderr)
        return 0
    print(f"stockade: no_session: no session named {args.name!r} (see 'stockade session list')",
          file=sys.stderr)
    return EXIT_NO_SESSION


def _list(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    sessions = _client(args).sessions()
    if args.json:
        print(json.dumps(sessions))
    elif not sessions:
        print("no sessions")
    else:
        print(_table(sessions))
    return 0


def relay(events: Iterable[Output | Result], *, as_json: bool,
          log: TextIO | None = None) -> int:
    """Write a streamed command's output to our stdout and stderr as it arrives (with
    `as_json`: print its Result as one JSON object instead, as `stockade run --json` does;
    its network log appended to `log`); returns its exit status, 128 + N for a command
    killed by signal N."""
    sys.stdout.flush()
    result = None
    for event in events:
        if isinstance(event, Result):
            result = event
        elif not as_json:
            stream = sys.stdout if event.stream == "stdout" else sys.stderr
            stream.buffer.write(event.data)
            stream.buffer.flush()
    if result is None:
        from stockade.session.errors import SessionError

        raise SessionError("session_lost", "the command's stream ended without a result")
    return finish(result, as_json=as_json, log=log)


def _client(args: argparse.Namespace) -> DaemonClient:
    # Imported here: every other command (`stockade run` above all) would pay for it.
    from stockade.session.client import DaemonClient

    return DaemonClient(args.socket)


def _source(args: argparse.Namespace, argv: list[str], *,
            cwd: str | None) -> tuple[Policy, str]:
    """The policy and absolute workspace to ask the daemon for. The command is compiled here
    too, so that a bad policy, path or argv is a located error (exit 2) before any request."""
    if args.workspace is not None and not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: not a directory")
    policy = chosen_policy(args)
    workspace = os.path.abspath(args.workspace or os.getcwd())
    compile_policy(policy, argv, CompileContext.current(workspace), cwd=cwd)
    return policy, workspace


def _environment(pairs: list[str]) -> dict[str, str]:
    env = env_flags(pairs)
    close_environment((), tuple(env.items()), {})  # refused names fail here, as in a Sandbox
    return env


def _timeout(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None


def stdin_input(mode: str | None) -> bytes | None:
    """Our stdin for a command given its whole input up front (a session's, a VM guest's):
    only with `mode` "inherit" (the policy's `process.stdin`, or `stockade run --stdin`), and
    only when it is not a terminal (the whole input travels at once, so a terminal could not
    be read live)."""
    if mode != "inherit" or sys.stdin is None or sys.stdin.isatty():
        return None
    data = sys.stdin.buffer.read(MAX_INPUT + 1)
    if len(data) > MAX_INPUT:
        raise UsageError(f"stdin is larger than {MAX_INPUT} bytes, the most a session command "
                         "can be given")
    return data


def _table(sessions: list[dict]) -> str:
    rows = [("SESSION", "READY", "BUSY", "COMMANDS", "IDLE")]
    rows += [(s["session"], "yes" if s["ready"] else "no", "yes" if s["busy"] else "no",
              str(s["commands"]), f"{s['idle']:.0f}s") for s in sessions]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip() for row in rows)
