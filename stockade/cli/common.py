"""What every command module of the CLI shares: building a subcommand, `--` handling, and the
flags that choose a policy."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from stockade.errors import UsageError
from stockade.policy import DEFAULT_PRESET, PRESETS, Policy, merge, resolve_policy
from stockade.policy.model import CONTAINMENTS, ISOLATIONS

Handler = Callable[[argparse.Namespace, list[str] | None], int]
EXIT_OUTPUT_FAILED = 74  # sysexits' EX_IOERR: output (Stockade's, or the command's relayed) lost


def drop_stdout() -> None:
    """Point stdout at /dev/null: what could not be written (and what is still buffered) goes
    nowhere, rather than failing again when Python flushes it at exit (a traceback-like
    "Exception ignored" and exit 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # cancel the command; exit 128 + the signal


class CommandLine(NamedTuple):
    """The command line itself (stockade/cli/__init__.py), for what runs it again: the CLI
    server, which the `daemon` handler starts, is handed it (`args.command_line`) rather than
    importing the package that imports its handler."""

    main: Callable[..., int]
    build_parser: Callable[..., argparse.ArgumentParser]  # (named: str | None = None)


class _CommandUsage(argparse.RawDescriptionHelpFormatter):
    """Help whose usage line ends with `-- COMMAND [ARG...]`: the command is split off before
    argparse sees the words, so argparse alone would not show it."""

    def _format_usage(self, *args: Any) -> str:
        return super()._format_usage(*args).rstrip("\n") + " -- COMMAND [ARG...]\n\n"


def subcommand(commands: Any, name: str, handler: Handler | None, summary: str,
               *examples: str, takes_command: bool = False) -> argparse.ArgumentParser:
    """A subcommand's parser; `takes_command`: it runs the command after `--`."""
    formatter = _CommandUsage if takes_command else argparse.RawDescriptionHelpFormatter
    parser = commands.add_parser(name, help=summary, description=summary,
                                 epilog=epilog(*examples), formatter_class=formatter)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def epilog(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def need_command(command: list[str] | None, name: str) -> list[str]:
    if command is None:
        raise UsageError(f"missing '--' before the command (stockade {name} ... -- argv...)")
    if not command:
        raise UsageError(f"no command after '--' (stockade {name} ... -- argv...)")
    return command


def no_command(command: list[str] | None) -> None:
    if command is not None:
        raise UsageError("'--' and a command are only for 'run', 'sandbox-exec' and "
                         "'session exec'")


def env_flags(pairs: list[str]) -> dict[str, str]:
    """The variables of --env NAME=VALUE flags (the policy's rules check them after)."""
    env = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not name or not equals:
            raise UsageError(f"--env {pair.split('=')[0][:40]!r}: expected NAME=VALUE")
        env[name] = value
    return env


def add_policy_source(parser: argparse.ArgumentParser) -> None:
    """--policy FILE | --preset NAME, --containment, and --workspace DIR."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policy", metavar="FILE", help="a TOML or JSON policy file")
    source.add_argument("--preset", metavar="NAME",
                        help=f"a named policy: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    parser.add_argument("--containment", choices=CONTAINMENTS,
                        help="override the policy's containment (vm: a QEMU guest, see "
                             "docs/vm.md)")
    parser.add_argument("--isolation", choices=ISOLATIONS,
                        help="override the policy's isolation (landlock: no namespaces, "
                             "Landlock, seccomp and rlimits on the host's own view, for hosts "
                             "where namespaces cannot be made; it enforces less, see "
                             "SECURITY.md and `stockade doctor`)")
    parser.add_argument("--workspace", metavar="DIR",
                        help="what {workspace} means (default: the current directory)")


def chosen_policy(args: argparse.Namespace) -> Policy:
    """The policy that `add_policy_source`'s flags name."""
    policy = resolve_policy(args.policy, args.preset)
    chosen = {name: value for name in ("containment", "isolation")
              if (value := getattr(args, name, None)) is not None}
    return merge(policy, chosen, file="command line") if chosen else policy


class Stopped(threading.Event):
    """Set by the first SIGINT or SIGTERM; `signum` is its number."""

    signum: int | None = None


@contextlib.contextmanager
def cancelled_by_signals() -> Iterator[Stopped]:
    """While the command runs, the first SIGINT (Ctrl-C) or SIGTERM cancels it (set the
    event; the command is killed and its end waited for, so that its result can still be
    said) and a second one interrupts at once. Only the main thread can set handlers:
    elsewhere the signals keep their own."""
    stopped = Stopped()
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def handler(number: int, frame: object) -> None:
        if stopped.signum is not None:
            raise KeyboardInterrupt
        stopped.signum = number
        stopped.set()

    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}
    try:
        yield stopped
    finally:
        for number, action in previous.items():
            signal.signal(number, action)
