"""The `stockade` command line (also `python -m stockade`).

    stockade run [--policy FILE | --preset NAME] [flags] -- argv...
    stockade sandbox-exec POLICY.json -- argv...
    stockade policy check FILE
    stockade policy show [--preset NAME | FILE] [--toml]
    stockade demo
    stockade report [--json]

Exit codes:

| code     | meaning                                                                        |
| -------- | ------------------------------------------------------------------------------ |
| 0-255    | `run`, `sandbox-exec`: the command's own exit status, passed through            |
| 128+N    | the command was killed by signal N (137 = SIGKILL, also after a timeout)        |
| 1        | `demo`: a forbidden attempt was not denied (or a permitted one was refused)     |
| 2        | usage or policy error (bad flag, policy file or preset); nothing ran            |
| 70       | the sandbox could not be set up here: unavailable, unenforceable, setup failed  |
| 71       | the sandbox was ready but the command could not be started (not found, ...)     |
| 130      | interrupted (Ctrl-C); the sandbox dies with Stockade                            |
| 141      | Stockade's own output was cut off (its reader closed the pipe)                  |

A command may itself exit 2, 70 or 71; `--json` tells the cases apart (an `error` object, or a
result). Every Stockade error is one line on stderr: `stockade: <code>: <message>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NoReturn

from stockade import __version__
from stockade.api import DEFAULT_PRESET, resolve_policy
from stockade.errors import StockadeError, UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import REGISTRY, SandboxManager, run_unsandboxed
from stockade.launch.result import Result
from stockade.policy import PRESETS, Policy, load_policy, merge, policy_to_document, preset
from stockade.policy.paths import lexical_key, tidy_path

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as if the shell's default disposition had applied
COMMAND_TAKERS = ("run", "sandbox-exec")  # the commands that take `-- argv...`

Handler = Callable[[argparse.Namespace, list[str] | None], int]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is a UsageError (one stderr line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def console_main() -> int:
    """The `stockade` program: a single-threaded process running one sandbox at a time, so it
    forks its sandbox directly instead of starting a zygote interpreter."""
    from stockade.linux import zygote

    zygote.fork_directly()
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    words = list(sys.argv[1:] if argv is None else argv)
    head, command = _split_command(words)
    json_mode = False
    try:
        args = _parse(head, command)
        json_mode = bool(getattr(args, "json", False))
        return args.handler(args, command)
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    except StockadeError as exc:
        return _fail(exc, json_mode)
    except KeyboardInterrupt:
        print("stockade: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # our reader went away (`stockade report | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _parse(head: list[str], command: list[str] | None) -> argparse.Namespace:
    args, extras = build_parser().parse_known_args(head)
    if extras:
        missing_cut = command is None and args.command in COMMAND_TAKERS
        hint = " (put the command after '--')" if missing_cut else ""
        raise UsageError(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return args


def build_parser() -> argparse.ArgumentParser:
    """The parser for every command (the command after `--` is split off before parsing)."""
    parser = _Parser(prog="stockade", description="Run untrusted commands in a sandbox.",
                     epilog=_examples("stockade run -- make test", "stockade demo",
                                      "stockade report"),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_sandbox_exec(commands)
    _add_policy(commands)
    _add_demo(commands)
    _add_report(commands)
    return parser


# --- the commands ----------------------------------------------------------------------------


def _add_run(commands: Any) -> None:
    run = _command(commands, "run", _run, "run a command in a fresh sandbox",
                   "stockade run -- sh -c 'echo hi'",
                   "stockade run --preset workspace-write --timeout 90s -- make",
                   "stockade run --policy agent.toml --read /opt/sdk -- ./build.sh",
                   "stockade run --json -- python3 -c 'print(1)'")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--policy", metavar="FILE", help="a TOML or JSON policy file")
    source.add_argument("--preset", metavar="NAME",
                        help=f"a named policy: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    run.add_argument("--workspace", metavar="DIR",
                     help="what {workspace} means (default: the current directory)")
    run.add_argument("--read", metavar="PATH", action="append", default=[],
                     help="also grant read access to PATH (relative: to the workspace)")
    run.add_argument("--write", metavar="PATH", action="append", default=[],
                     help="also grant write access to PATH (relative: to the workspace)")
    run.add_argument("--allow-domain", metavar="D", action="append", default=[],
                     help="allow network access to domain D (switches to allowlist mode)")
    run.add_argument("--timeout", metavar="T", help='wall-clock limit such as "90s" or "5m"')
    run.add_argument("--verbose", "-v", action="store_true",
                     help="after the run, print each launch stage and its duration on stderr")
    run.add_argument("--json", action="store_true",
                     help="capture output and print one JSON result (or error) object")
    run.add_argument("--unsandboxed", action="store_true",
                     help="run on the host WITHOUT a sandbox, with a warning; refused (70) "
                          "unless the policy restricts nothing at all")


def _run(args: argparse.Namespace, command: list[str] | None) -> int:
    argv = _need_command(command, "run")
    if args.workspace is not None and not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: not a directory")
    chosen = _with_flags(resolve_policy(args.policy, args.preset), args)
    if args.unsandboxed:
        return run_unsandboxed(argv, chosen)
    return _execute(chosen, argv, args.workspace, as_json=args.json, verbose=args.verbose)


def _add_sandbox_exec(commands: Any) -> None:
    shim = _command(commands, "sandbox-exec", _sandbox_exec,
                    "run a command under a policy file (the module-runner shim)",
                    "stockade sandbox-exec module-policy.json -- ./module --input data/")
    shim.add_argument("policy", metavar="POLICY", help="a JSON or TOML policy file")


def _sandbox_exec(args: argparse.Namespace, command: list[str] | None) -> int:
    argv = _need_command(command, "sandbox-exec")
    return _execute(load_policy(args.policy), argv, None, as_json=False)


def _add_policy(commands: Any) -> None:
    policy = _command(commands, "policy", None, "check or show policies",
                      "stockade policy check agent.toml",
                      "stockade policy show --preset workspace-write")
    actions = policy.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = _command(actions, "check", _policy_check,
                     "validate a policy file and print its normalised form",
                     "stockade policy check agent.toml")
    check.add_argument("file", metavar="FILE", help="a TOML or JSON policy file")
    show = _command(actions, "show", _policy_show,
                    "print a preset or a policy file as its normalised document",
                    "stockade policy show", "stockade policy show --preset offline-build --toml",
                    "stockade policy show agent.toml")
    source = show.add_mutually_exclusive_group()
    source.add_argument("--preset", metavar="NAME",
                        help=f"{', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    source.add_argument("file", metavar="FILE", nargs="?", help="a TOML or JSON policy file")
    show.add_argument("--toml", action="store_true", help="print TOML instead of JSON")


def _policy_check(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    document = policy_to_document(load_policy(args.file))
    print("ok")
    print(json.dumps(document, indent=2))
    return 0


def _policy_show(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    chosen = load_policy(args.file) if args.file else preset(args.preset or DEFAULT_PRESET)
    document = policy_to_document(chosen)
    print(to_toml(document) if args.toml else json.dumps(document, indent=2))
    return 0


def _add_demo(commands: Any) -> None:
    _command(commands, "demo", _demo,
             "try forbidden things inside a real sandbox and show each denial",
             "stockade demo")


def _demo(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    from stockade import demo  # imported on demand: it is the only user of its modules

    return demo.main()


def _add_report(commands: Any) -> None:
    report = _command(commands, "report", _report,
                      "what this host enforces, capability by capability",
                      "stockade report", "stockade report --json")
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _report(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    backends = [_backend_report(name) for name in REGISTRY]
    if args.json:
        print(json.dumps({"backends": backends}, indent=2))
        return 0
    for backend in backends:
        print(f"{backend['name']}: {'ready' if backend['ready'] else backend['reason']}")
        rows = [(c["name"], "yes" if c["enforced"] else "NO", c["mechanism"], c["detail"])
                for c in backend["capabilities"]]
        print(_table(("capability", "enforced", "mechanism", "detail"), rows))
    return 0


# --- helpers ---------------------------------------------------------------------------------


def _command(commands: Any, name: str, handler: Handler | None, summary: str,
             *examples: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=summary, description=summary,
                                 epilog=_examples(*examples),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _split_command(words: list[str]) -> tuple[list[str], list[str] | None]:
    """Stockade's own arguments, and the command after the first `--` (None without one)."""
    if "--" not in words:
        return words, None
    cut = words.index("--")
    return words[:cut], words[cut + 1:]


def _need_command(command: list[str] | None, name: str) -> list[str]:
    if command is None:
        raise UsageError(f"missing '--' before the command (stockade {name} ... -- argv...)")
    if not command:
        raise UsageError(f"no command after '--' (stockade {name} ... -- argv...)")
    return command


def _no_command(command: list[str] | None) -> None:
    if command is not None:
        raise UsageError("'--' and a command are only for 'run' and 'sandbox-exec'")


def _with_flags(policy: Policy, args: argparse.Namespace) -> Policy:
    """`policy` plus the --read/--write/--allow-domain/--timeout flags, validated as policy.

    The flags' values go first in each list, so an error's `[index]` counts that flag's uses.
    """
    fs, net = policy.filesystem, policy.network
    sections: dict[str, dict[str, Any]] = {}
    if args.read or args.write:
        # A --write of a path the policy only reads upgrades it, rather than conflicting.
        writes = {_lexical(path) for path in args.write}
        reads = [path for path in fs.read if _lexical(path) not in writes]
        sections["filesystem"] = {"read": [*args.read, *reads],
                                  "write": [*args.write, *fs.write]}
    if args.allow_domain:
        sections["network"] = {"mode": "allowlist", "allow": [*args.allow_domain, *net.allow]}
    if args.timeout is not None:
        sections["limits"] = {"timeout": args.timeout}
    return merge(policy, sections, file="command line") if sections else policy


def _lexical(path: str) -> tuple[str, ...] | str:
    try:
        return lexical_key(tidy_path(path, optional_allowed=True))
    except ValueError:
        return path  # invalid: the policy parser reports it, located


def _execute(policy: Policy, argv: list[str], workspace: str | None, *, as_json: bool,
             verbose: bool = False) -> int:
    """Run `argv`: output passed through live, or captured and printed as one JSON object."""
    request = compile_policy(policy, argv, CompileContext.current(workspace))
    sys.stdout.flush()
    sys.stderr.flush()
    result = SandboxManager().run(request, stdio_inherit=not as_json)
    if as_json:
        print(json.dumps(result.to_json()))
    if verbose:
        stages = ", ".join(f"{name} {ms:.1f}" for name, ms in result.timings.items())
        print(f"stockade: {result.backend} launch stages (ms): {stages}; "
              f"digest {result.digest[:16]}", file=sys.stderr)
    _print_violations(result)
    return result.returncode


def _print_violations(result: Result) -> None:
    if result.violations:
        listed = "; ".join(f"{v.kind} ({v.detail})" for v in result.violations)
        print(f"stockade: denied/limited: {listed}", file=sys.stderr)


def _fail(error: StockadeError, json_mode: bool) -> int:
    if json_mode:
        print(json.dumps({"error": {"code": error.code, "message": error.message}}))
    print(f"stockade: {' '.join(str(error).splitlines())}", file=sys.stderr)
    return error.exit_code


def _backend_report(name: str) -> dict[str, Any]:
    backend = REGISTRY[name]()
    try:
        backend.probe()
        reason = None
    except StockadeError as exc:
        reason = str(exc)
    capabilities = [asdict(capability) for capability in backend.report()]
    return {"name": name, "ready": reason is None, "reason": reason,
            "capabilities": capabilities}


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             for row in (header, *rows)]
    return "\n".join(line.rstrip() for line in lines)


def to_toml(document: dict[str, Any]) -> str:
    """A policy document (as from `policy_to_document`) written as TOML."""
    top = [f"{key} = {_toml_value(value)}" for key, value in document.items()
           if not isinstance(value, dict)]
    tables = [f"\n[{key}]\n" + "\n".join(f"{name} = {_toml_value(item)}"
                                         for name, item in value.items())
              for key, value in document.items() if isinstance(value, dict)]
    return "\n".join(top) + "\n" + "\n".join(tables) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)
