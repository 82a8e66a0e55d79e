"""Stockade's parts run on their own: `stockade evidence`, `proxy`, `agent` and `daemon`."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.launch.manager import REGISTRY
from stockade.policy.units import parse_duration


def add_proxy(commands: Any) -> None:
    proxy = subcommand(commands, "proxy", _proxy,
                       "run the egress proxy alone, in the foreground, logging every decision",
                       "stockade proxy --allow pypi.org --allow '*.pythonhosted.org'",
                       "stockade proxy --allow example.com --listen 127.0.0.1:3128 --log d.jsonl")
    proxy.add_argument("--allow", metavar="PATTERN", action="append", default=[], required=True,
                       help="a domain pattern to allow (exact, *.suffix, optional :port)")
    proxy.add_argument("--deny", metavar="PATTERN", action="append", default=[],
                       help="a domain pattern to deny (checked first)")
    proxy.add_argument("--listen", metavar="HOST:PORT",
                       help="a loopback address to listen on (default: a fresh unix socket)")
    proxy.add_argument("--log", metavar="FILE",
                       help="append decisions as JSON lines to FILE (default: stdout)")


def _proxy(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.net.serve import serve

    return serve(args.allow, args.deny, listen=args.listen, log=args.log)


def add_evidence(commands: Any) -> None:
    evidence = subcommand(commands, "evidence", _evidence,
                          "attack this host's sandbox with real malicious children, one row each",
                          "stockade evidence", "stockade evidence --only network --json",
                          "stockade evidence --markdown --allow-not-run")
    shape = evidence.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print one JSON document")
    shape.add_argument("--markdown", action="store_true", help="print Markdown tables")
    evidence.add_argument("--only", metavar="CATEGORY", action="append", default=[],
                          help="only this category or row id (repeatable)")
    evidence.add_argument("--allow-not-run", action="store_true",
                          help="exit 0 even if some rows cannot run on this host")
    evidence.add_argument("--backend", choices=list(REGISTRY), default=next(iter(REGISTRY)),
                          help="the backend to attack (default %(default)s)")


def _evidence(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.evidence import command as evidence  # imported on demand: it is large

    output = "json" if args.json else "markdown" if args.markdown else "text"
    return evidence.main(REGISTRY[args.backend](), output=output, only=args.only,
                         allow_not_run=args.allow_not_run)


def add_agent(commands: Any) -> None:
    subcommand(commands, "agent", _agent,
               "serve one warm session on stdin/stdout (runs INSIDE a sandbox; see "
               "docs/protocol.md)", "stockade agent")


def _agent(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.session import agent  # the guest side needs nothing else from the CLI

    return agent.main()


def add_daemon(commands: Any) -> None:
    daemon = subcommand(commands, "daemon", _daemon,
                        "own warm sandboxes for this user's processes, on a unix socket",
                        "stockade daemon", "stockade daemon --socket /run/user/1000/stockade.sock")
    daemon.add_argument("--socket", metavar="PATH",
                        help="the control socket (default: daemon.sock in the state directory)")
    daemon.add_argument("--idle", metavar="T", type=_duration, default=300.0,
                        help='tear a session down after this long unused, such as "5m" or '
                             "300 (seconds; the default)")
    daemon.add_argument("--no-cli-server", action="store_true",
                        help="do not serve `stockade run` and `sandbox-exec` (see "
                             "stockade/cli/server.py)")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _daemon(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)

    from stockade.cli import server as cli_server
    from stockade.session.daemon import Daemon

    server = Daemon(args.socket, idle=args.idle)
    server.bind()
    # Forked while this process has one thread; `stockade run` is then served by it.
    cli = None if args.no_cli_server else cli_server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    print(f"stockade: daemon listening on {server.path}", file=sys.stderr, flush=True)
    if server.reclaimed:
        print(f"stockade: reclaimed {server.reclaimed} sandbox(es) of an earlier daemon",
              file=sys.stderr, flush=True)
    try:
        server.serve()
    finally:
        if cli is not None:
            cli_server.stop(cli)
    return 0
