"""Stockade's parts run on their own: `stockade evidence`, `proxy`, `agent` and `daemon`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from stockade.cli.common import no_command, subcommand
from stockade.launch import registry
from stockade.policy.model import ISOLATIONS
from stockade.policy.units import parse_duration

LOG_NAME = "daemon.log"  # a background daemon's stderr, beside its socket


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
    shape.add_argument("--json", action="store_true",
                       help="print one JSON document (a terminal on stderr is shown a count "
                            "of the rows meanwhile)")
    shape.add_argument("--markdown", action="store_true", help="print Markdown tables")
    evidence.add_argument("--only", metavar="CATEGORY", action="append", default=[],
                          help="only this category or row id (repeatable)")
    evidence.add_argument("--allow-not-run", action="store_true",
                          help="exit 0 even if some rows cannot run on this host")
    backends = registry.names(registry.NATIVE)
    evidence.add_argument("--backend", choices=backends, default=backends[0],
                          help="the backend to attack (default %(default)s)")
    evidence.add_argument("--isolation", choices=ISOLATIONS, default=ISOLATIONS[0],
                          help="the backend's isolation to attack (landlock: the tier without "
                               "namespaces; rows it does not enforce say so, as its report "
                               "does)")


def _evidence(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)
    from stockade.evidence import command as evidence  # imported on demand: it is large

    output = "json" if args.json else "markdown" if args.markdown else "text"
    backend = registry.create(registry.entry(args.backend))
    return evidence.main(backend, output=output, only=args.only,
                         allow_not_run=args.allow_not_run, isolation=args.isolation)


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
                        "stockade daemon", "stockade daemon --socket /run/user/1000/stockade.sock",
                        'daemon=$(stockade daemon --background); ...; kill "$daemon"')
    daemon.add_argument("--socket", metavar="PATH",
                        help="the control socket (default: daemon.sock in the state directory)")
    daemon.add_argument("--idle", metavar="T", type=_duration, default=300.0,
                        help='tear a session down after this long unused, such as "5m" or '
                             "300 (seconds; the default)")
    daemon.add_argument("--no-cli-server", action="store_true",
                        help="do not serve `stockade run` and `sandbox-exec` (see "
                             "stockade/cli/server.py)")
    daemon.add_argument("--background", action="store_true",
                        help="run in the background: return once it listens, printing its pid "
                             f"(its later messages go to {LOG_NAME} beside the socket)")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _daemon(args: argparse.Namespace, command: list[str] | None) -> int:
    no_command(command)

    from stockade.cli import server as cli_server
    from stockade.session.daemon import Daemon

    ready = None
    if args.background:  # (forked before anything here starts a thread)
        ready_read, ready = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            os.close(ready)
            return _when_listening(pid, ready_read)
        os.close(ready_read)
        os.setsid()  # out of the caller's session: its Ctrl-C or hang-up is not ours
    server = Daemon(args.socket, idle=args.idle)
    server.bind()
    if ready is not None:  # before the CLI server forks: neither keeps the caller's streams
        _streams_to_log(os.path.join(os.path.dirname(os.path.abspath(server.path)), LOG_NAME))
    # Forked while this process has one thread; `stockade run` is then served by it.
    cli = None if args.no_cli_server else cli_server.start(args.command_line)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    said = f"stockade: daemon listening on {server.path}\n"
    if server.replaced:
        said += (f"stockade: replaced a socket at {server.path} whose listener was no "
                 f"Stockade server of this user ({server.replaced}); it was sent nothing\n")
    if server.reclaimed:
        said += f"stockade: reclaimed {server.reclaimed} sandbox(es) of an earlier daemon\n"
    if ready is None:
        print(said, end="", file=sys.stderr, flush=True)
    else:
        os.write(ready, said.encode())
        os.close(ready)
    try:
        server.serve()
    finally:
        if cli is not None:
            cli_server.stop(cli)
    return 0


def _when_listening(pid: int, ready: int) -> int:
    """In the caller of `daemon --background`: once daemon `pid` says it listens (on the pipe
    `ready`), print what it said to stderr and its pid to stdout, and return 0; if it ends
    first (its error is already on stderr), its exit status."""
    with os.fdopen(ready, "rb") as pipe:
        said = pipe.read()
    if said:
        sys.stderr.write(said.decode())
        print(pid)
        return 0
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) or 70


def _streams_to_log(path: str) -> None:
    """A background daemon's stdin and stdout on /dev/null, its stderr appended to `path`."""
    null = os.open(os.devnull, os.O_RDWR)
    log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for fd, target in ((0, null), (1, null), (2, log)):
        os.dup2(target, fd)
    os.close(null)
    os.close(log)
