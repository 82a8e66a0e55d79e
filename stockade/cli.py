"""The `stockade` command line (also `python -m stockade`).

    stockade run [--policy FILE | --preset NAME] [flags] -- argv...
    stockade sandbox-exec POLICY.json -- argv...
    stockade policy check FILE
    stockade policy show [--preset NAME | FILE] [--toml]
    stockade demo
    stockade probe [--json]
    stockade report [--json | --markdown]
    stockade reconcile [--json]
    stockade evidence [--json | --markdown] [--only CATEGORY] [--allow-not-run]
    stockade proxy --allow PATTERN [--deny PATTERN] [--listen HOST:PORT] [--log FILE]

Exit codes:

| code     | meaning                                                                        |
| -------- | ------------------------------------------------------------------------------ |
| 0-255    | `run`, `sandbox-exec`: the command's own exit status, passed through            |
| 128+N    | the command was killed by signal N (137 = SIGKILL, also after a timeout)        |
| 1        | `demo`: a forbidden attempt was not denied (or a permitted one was refused)     |
| 1        | `reconcile`: a record was quarantined, or a resource could not be removed yet   |
| 1        | `evidence`: a row FAILed (the sandbox did not hold)                             |
| 3        | `evidence`: no row failed, but some could not run here (`--allow-not-run`)      |
| 2        | usage or policy error (bad flag, policy file or preset); nothing ran            |
| 70       | the sandbox could not be set up here: unavailable, unenforceable, setup failed  |
|          | (`probe`: not ready; the attestation says why)                                  |
| 71       | the sandbox was ready but the command could not be started (not found, ...)     |
| 130      | interrupted (Ctrl-C); the sandbox dies with Stockade                            |
| 141      | Stockade's own output was cut off (its reader closed the pipe)                  |

A command may itself exit 2, 70 or 71; `--json` tells the cases apart (an `error` object, or a
result). Every Stockade error is one line on stderr: `stockade: <code>: <message>`.

`--state-dir DIR` (before the command) sets where the launch ledger lives, for this process
and its children, as `STOCKADE_STATE_DIR` does (see stockade/lifecycle/statedir.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from stockade import __version__
from stockade.api import DEFAULT_PRESET, resolve_policy
from stockade.errors import EXIT_SETUP, StockadeError, UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import REGISTRY, SandboxManager, execute, run_unsandboxed
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
        if args.state_dir is not None:
            from stockade.lifecycle import statedir

            os.environ[statedir.ENV] = os.path.abspath(args.state_dir)
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
    parser.add_argument("--state-dir", metavar="DIR",
                        help="where the launch ledger lives (default: $STOCKADE_STATE_DIR, "
                             "else $XDG_STATE_HOME/stockade, /var/lib/stockade for root, "
                             "~/.local/state/stockade)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands)
    _add_sandbox_exec(commands)
    _add_policy(commands)
    _add_demo(commands)
    _add_probe(commands)
    _add_report(commands)
    _add_reconcile(commands)
    _add_evidence(commands)
    _add_proxy(commands)
    _add_agent(commands)
    _add_daemon(commands)
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
    run.add_argument("--network-log", metavar="FILE",
                     help="append the egress proxy's decision records (JSON lines) to FILE")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="after the run, print on stderr the layers applied and each stage's "
                          "duration: compile, readiness (probe and ledger reconcile), then the "
                          "sandbox's own stages")
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
    return _execute(chosen, argv, args.workspace, as_json=args.json, verbose=args.verbose,
                    network_log=args.network_log)


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


def _add_probe(commands: Any) -> None:
    probe = _command(commands, "probe", _probe,
                     "launch a throwaway sandbox and attest what it verified (exit 70: not ready)",
                     "stockade probe", "stockade probe --json")
    probe.add_argument("--json", action="store_true", help="print the attestation as JSON")


def _probe(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    from stockade.lifecycle.probe import probe

    attestation = probe()
    if args.json:
        print(json.dumps(attestation.to_json(), indent=2))
    else:
        state = "ready" if attestation.ready else (
            f"NOT READY: {attestation.reason} at stage {attestation.stage}: "
            f"{attestation.message}")
        print(f"{attestation.backend}: {state} (run as {attestation.run_as}, "
              f"{attestation.duration_ms:.0f} ms)")
        for fact, value in attestation.facts.items():
            print(f"  {fact}: {json.dumps(value)}")
    return 0 if attestation.ready else EXIT_SETUP


def _add_report(commands: Any) -> None:
    report = _command(commands, "report", _report,
                      "what this host enforces, capability by capability, from a real probe",
                      "stockade report", "stockade report --json", "stockade report --markdown")
    shape = report.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON instead of a table")
    shape.add_argument("--markdown", action="store_true", help="print Markdown tables")


def _report(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    from stockade.lifecycle.probe import probe
    from stockade.lifecycle.report import build

    reports = []
    for factory in REGISTRY.values():
        backend = factory()
        reports.append(build(probe(backend), backend))
    if args.json:
        print(json.dumps({"backends": [report.to_json() for report in reports]}, indent=2))
    elif args.markdown:
        print("\n".join(report.markdown() for report in reports), end="")
    else:
        print("\n\n".join(report.text() for report in reports))
    return 0


def _add_reconcile(commands: Any) -> None:
    reconcile = _command(commands, "reconcile", _reconcile,
                         "remove what crashed launches left behind, as recorded in the ledger",
                         "stockade reconcile", "stockade --state-dir /srv/stockade reconcile")
    reconcile.add_argument("--json", action="store_true", help="print a JSON summary")


def _reconcile(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    from dataclasses import asdict

    from stockade.lifecycle.ledger import Ledger

    ledger = Ledger()
    done = ledger.reconcile()
    quarantined = ledger.quarantined()
    if args.json:
        print(json.dumps({**asdict(done), "quarantine": quarantined,
                          "quarantine_dir": ledger.quarantine_dir}))
    else:
        print(f"reconciled {done.reconciled} record(s), {len(done.removed)} resource(s) removed; "
              f"{done.live} live, {done.failed} to retry")
        for kind, name in done.removed:
            print(f"  removed {kind} {name}")
        if quarantined:
            print(f"{len(quarantined)} record(s) in quarantine, readiness fails until they are "
                  f"inspected and deleted: {ledger.quarantine_dir}")
    return 1 if quarantined or done.failed else 0


def _add_proxy(commands: Any) -> None:
    proxy = _command(commands, "proxy", _proxy,
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
    _no_command(command)
    from stockade.net.serve import serve

    return serve(args.allow, args.deny, listen=args.listen, log=args.log)


def _add_evidence(commands: Any) -> None:
    evidence = _command(commands, "evidence", _evidence,
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
    _no_command(command)
    from stockade.evidence import command as evidence  # imported on demand: it is large

    output = "json" if args.json else "markdown" if args.markdown else "text"
    return evidence.main(REGISTRY[args.backend](), output=output, only=args.only,
                         allow_not_run=args.allow_not_run)


def _add_agent(commands: Any) -> None:
    _command(commands, "agent", _agent,
             "serve one warm session on stdin/stdout (runs INSIDE a sandbox; see "
             "docs/protocol.md)", "stockade agent")


def _agent(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    from stockade.session import agent  # the guest side needs nothing else from the CLI

    return agent.main()


def _add_daemon(commands: Any) -> None:
    daemon = _command(commands, "daemon", _daemon,
                      "own warm sandboxes for this user's processes, on a unix socket",
                      "stockade daemon", "stockade daemon --socket /run/user/1000/stockade.sock")
    daemon.add_argument("--socket", metavar="PATH",
                        help="the control socket (default: daemon.sock in the state directory)")
    daemon.add_argument("--idle", metavar="SECONDS", type=float, default=300.0,
                        help="tear a session down after this long unused (default 300)")


def _daemon(args: argparse.Namespace, command: list[str] | None) -> int:
    _no_command(command)
    import signal

    from stockade.linux import zygote
    from stockade.session.daemon import Daemon

    # Many sandboxes, from many threads: through the zygote, not forked from this process.
    zygote.SPAWNER = zygote.ZYGOTE
    server = Daemon(args.socket, idle=args.idle)
    server.bind()
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    print(f"stockade: daemon listening on {server.path}", file=sys.stderr, flush=True)
    server.serve()
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
             verbose: bool = False, network_log: str | None = None) -> int:
    """Run `argv`: output passed through live, or captured and printed as one JSON object."""
    started = time.monotonic()
    request = compile_policy(policy, argv, CompileContext.current(workspace))
    compiled = time.monotonic()
    backend = SandboxManager().select(request)  # the first time: readiness probe and ledger
    selected = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    result = execute(backend, request, stdio_inherit=not as_json)
    if network_log is not None:
        with open(network_log, "a", encoding="utf-8") as log:
            log.writelines(json.dumps(entry) + "\n" for entry in result.network_log)
    if as_json:
        print(json.dumps(result.to_json()))
    if verbose:
        owner = {"compile": (compiled - started) * 1000, "readiness": (selected - compiled) * 1000}
        stages = ", ".join(f"{name} {ms:.1f}" for name, ms in {**owner, **result.timings}.items())
        layers = _layers(result.enforced)
        print(f"stockade: {result.backend} layers: {layers}", file=sys.stderr)
        print(f"stockade: {result.backend} launch stages (ms): {stages}; "
              f"digest {result.digest[:16]}", file=sys.stderr)
    _print_violations(result)
    return result.returncode


def _layers(enforced: dict) -> str:
    """What the sandbox's pid 1 reported applying, in one line (names and numbers only)."""
    landlock = enforced.get("landlock", {})
    seccomp = enforced.get("seccomp", {})
    limits = ", ".join(sorted(enforced.get("limits", {})))
    return (f"namespaces {','.join(enforced.get('namespaces', []))}; "
            f"landlock ABI {landlock.get('abi', 0)}; "
            f"seccomp {seccomp.get('mode', 'off')} ({seccomp.get('denied_syscalls', 0)} denied); "
            f"limits {limits or 'none'}")


def _print_violations(result: Result) -> None:
    if result.violations:
        listed = "; ".join(f"{v.kind} ({v.detail})" for v in result.violations)
        print(f"stockade: denied/limited: {listed}", file=sys.stderr)


def _fail(error: StockadeError, json_mode: bool) -> int:
    if json_mode:
        print(json.dumps({"error": {"code": error.code, "message": error.message}}))
    print(f"stockade: {' '.join(str(error).splitlines())}", file=sys.stderr)
    return error.exit_code


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
