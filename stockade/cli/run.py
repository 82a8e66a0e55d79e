"""`stockade run` and `stockade sandbox-exec`: a command in a fresh sandbox."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, TextIO

from stockade.cli.common import (
    EXIT_OUTPUT_FAILED,
    add_policy_source,
    cancelled_by_signals,
    chosen_policy,
    drop_stdout,
    env_flags,
    need_command,
    subcommand,
)
from stockade.errors import UsageError
from stockade.launch import registry
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.denials import denial, denial_lines
from stockade.launch.manager import OUTPUT_FAILED, SandboxManager, execute, run_unsandboxed
from stockade.launch.result import Result
from stockade.policy import Policy, load_policy, merge
from stockade.policy.model import STDIN_MODES, NetworkPolicy
from stockade.policy.paths import lexical_key, tidy_path
from stockade.visibletext import RESET, visible


def add_run(commands: Any) -> None:
    run = subcommand(commands, "run", _run, "run a command in a fresh sandbox",
                     "stockade run -- sh -c 'echo hi'",
                     "stockade run --preset workspace-write --timeout 90s -- make",
                     "stockade run --policy agent.toml --read /opt/sdk -- ./build.sh",
                     "stockade run --network any --reach 10.0.0.5:5432 -- ./migrate.sh",
                     "stockade run --env CI=1 -- make test",
                     "stockade run --json -- python3 -c 'print(1)'", takes_command=True)
    add_policy_source(run)
    run.add_argument("--read", metavar="PATH", action="append", default=[],
                     help="also grant read access to PATH (relative: to the workspace)")
    run.add_argument("--write", metavar="PATH", action="append", default=[],
                     help="also grant write access to PATH (relative: to the workspace). The "
                          "command's /tmp is its own, empty, and gone when it ends: what must "
                          "stay belongs under a write root")
    run.add_argument("--allow-domain", metavar="D", action="append", default=[],
                     help="allow network access to domain D (switches to allowlist mode)")
    run.add_argument("--network", choices=("none", "any"),
                     help='override the policy\'s network mode: none, or any (the internet '
                          "through user-mode networking, with loopback, link-local, metadata, "
                          "private and the host's own addresses refused; Linux)")
    run.add_argument("--reach", metavar="ADDR[:PORT]", action="append", default=[],
                     help="let mode any reach ADDR (an address or range, optionally one port) "
                          "past its guard (switches to mode any)")
    run.add_argument("--timeout", metavar="T", help='wall-clock limit such as "90s" or "5m"')
    run.add_argument("--env", metavar="NAME=VALUE", action="append", default=[],
                     help="add a variable to the policy's closed environment (repeatable; "
                          "names the policy refuses are refused here too)")
    run.add_argument("--stdin", choices=STDIN_MODES,
                     help="the command's stdin: inherit (this process's stdin, copied through "
                          "a pipe: a terminal itself never enters the sandbox) or null "
                          "(/dev/null). Default: the policy's process.stdin; if it has none, "
                          "inherit when stdin is a pipe or a file (echo x | stockade run -- wc "
                          "-l counts 1), null when it is a terminal: what is typed there "
                          "reaches the command only with --stdin inherit. In a VM "
                          "(containment vm) only an explicit inherit reads stdin, whole, "
                          "before the command starts")
    run.add_argument("--ask", action="store_true",
                     help="network allowlist: while the command runs, ask at this terminal "
                          "(/dev/tty, never the command's stdio) about each destination "
                          "network.allow leaves out: allow it once, for the run, or not; no "
                          f"answer in {ASK_SECONDS:g}s denies it. An approval lifts no "
                          "address check and no network.deny pattern")
    run.add_argument("--network-log", metavar="FILE",
                     help="append the egress proxy's decision records (JSON lines) to FILE")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="after the run, print on stderr the layers applied and each stage's "
                          "duration: compile, readiness (probe and ledger reconcile), then the "
                          "sandbox's own stages")
    run.add_argument("--json", action="store_true",
                     help="capture output and print one JSON result (or error) object; "
                          "Ctrl-C cancels the command and prints its result (cancelled: "
                          "true); output that is not UTF-8 is also given whole as "
                          "stdout_base64 / stderr_base64")
    run.add_argument("--overlay", action="store_true",
                     help="a copy-on-write workspace (filesystem.workspace = \"overlay\"): "
                          "the command's writes to its write roots are kept aside, for "
                          "`stockade changes`, then `stockade apply` or `stockade discard`")
    run.add_argument("--unsandboxed", action="store_true",
                     help="run on the host WITHOUT a sandbox, with a warning; refused (70) "
                          "unless the policy restricts nothing at all")


def _run(args: argparse.Namespace, command: list[str] | None) -> int:
    argv = need_command(command, "run")
    if args.workspace is not None and not os.path.isdir(args.workspace):
        raise UsageError(f"--workspace {args.workspace}: not a directory")
    chosen = _with_flags(chosen_policy(args), args)
    if args.unsandboxed:
        return run_unsandboxed(argv, chosen)
    stdin = args.stdin or chosen.process.stdin
    if stdin is None and chosen.containment != "vm":
        stdin = stdin_by_default()
    status = run_sandboxed(chosen, argv, args.workspace, as_json=args.json,
                           verbose=args.verbose, network_log=args.network_log, stdin=stdin,
                           ask=args.ask)
    if status != 0 and args.stdin is None and stdin in (None, "null") and os.isatty(0):
        # (a prompt read EOF at once, and nothing said why: the terminal is not passed)
        print("stockade: hint: the command's stdin was /dev/null, not this terminal; if it "
              "asked for input, run it with --stdin inherit", file=sys.stderr)
    return status


def stdin_by_default() -> str:
    """`stockade run`'s stdin when neither --stdin nor the policy says: inherit when ours is
    a pipe or a file, as a command run directly would read it; null when it is a terminal
    (typed input is not for the sandbox unless asked for) or closed."""
    try:
        os.fstat(0)
    except OSError:
        return "null"
    return "null" if os.isatty(0) else "inherit"


def add_sandbox_exec(commands: Any) -> None:
    shim = subcommand(commands, "sandbox-exec", _sandbox_exec,
                      "run a command under a policy file (the module-runner shim)",
                      "stockade sandbox-exec module-policy.json -- ./module --input data/",
                      takes_command=True)
    shim.add_argument("policy", metavar="POLICY", help="a JSON or TOML policy file")


def _sandbox_exec(args: argparse.Namespace, command: list[str] | None) -> int:
    argv = need_command(command, "sandbox-exec")
    return run_sandboxed(load_policy(args.policy), argv, None, as_json=False)


def _with_flags(policy: Policy, args: argparse.Namespace) -> Policy:
    """`policy` plus the --read/--write/--allow-domain/--network/--reach/--timeout/--env
    flags, validated as policy.

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
    if args.network or args.reach:
        sections["network"] = _network_flags(args, net)
    if args.timeout is not None:
        sections["limits"] = {"timeout": args.timeout}
    if args.overlay:
        sections.setdefault("filesystem", {})["workspace"] = "overlay"
    if args.env:
        sections["env"] = {"set": env_flags(args.env)}
    return merge(policy, sections, file="command line") if sections else policy


def _network_flags(args: argparse.Namespace, net: NetworkPolicy) -> dict[str, Any]:
    """The network section --network and --reach make (the policy's allow list goes: it is
    the allowlist mode's; its reach list stays with mode any)."""
    mode = args.network or "any"
    if args.allow_domain:
        raise UsageError(f"--allow-domain switches to mode allowlist: it cannot be combined "
                         f"with {'--network' if args.network else '--reach'}")
    if args.reach and mode != "any":
        raise UsageError("--reach lifts the guard of mode any: it cannot be combined with "
                         "--network none")
    return {"mode": mode, "allow": [],
            "reach": [*args.reach, *net.reach] if mode == "any" else []}


def _lexical(path: str) -> tuple[str, ...] | str:
    try:
        return lexical_key(tidy_path(path, optional_allowed=True))
    except ValueError:
        return path  # invalid: the policy parser reports it, located


ASK_SECONDS = 60.0  # how long --ask waits for an answer at the terminal
# "1": none of Stockade's lines on the run's denials after the command (its stderr exact)
QUIET = "STOCKADE_QUIET_DENIALS"

# Set by the `stockade` program (not by callers of `main`, who may have threads): fork the
# one sandbox from this process rather than start a zygote.
fork_directly = False
# Whether this process launched a sandbox: only then does the program start a CLI server for
# the next run (not after --help, a usage error or a refusal, whatever their exit status).
launched = False


def run_sandboxed(policy: Policy, argv: list[str], workspace: str | None, *, as_json: bool,
                  verbose: bool = False, network_log: str | None = None,
                  stdin: str | None = None, ask: bool = False) -> int:
    """Run `argv` in a fresh sandbox (`stockade run`, `sandbox-exec`, `exec`): output passed
    through live, or captured and printed as one JSON object; returns the exit status.
    `stdin` ("null" | "inherit") overrides the policy's `process.stdin` (unset: null). What
    it writes to is opened first, so that it cannot fail once the command has run. `ask`:
    the proxy's questions go to this terminal (cli/ask.py)."""
    stdin = stdin or policy.process.stdin or "null"
    if as_json:
        _check_stdout()
    else:
        _check_streams_open()
    log = None if network_log is None else _open_for_appending(network_log, "--network-log")
    try:
        return _launch(policy, argv, workspace, as_json=as_json, verbose=verbose, stdin=stdin,
                       log=log, ask=ask)
    finally:
        if log is not None:
            with contextlib.suppress(OSError):  # (finish said it if the lines did not go)
                log.close()


def _launch(policy: Policy, argv: list[str], workspace: str | None, *, as_json: bool,
            verbose: bool, stdin: str, log: TextIO | None, ask: bool = False) -> int:
    """The one launch, in the backend the manager chooses for the policy's containment
    (native, or a VM guest: registry.py)."""
    if fork_directly:
        registry.prepare(policy.containment)
    started = time.monotonic()
    request = compile_policy(policy, argv, CompileContext.current(workspace), stdin=stdin)
    compiled = time.monotonic()
    backend = SandboxManager().select(request)  # the first time: readiness probe and ledger
    if ask:
        if request.network.mode != "allowlist" or not hasattr(backend, "with_approval"):
            raise UsageError('--ask asks about what network.allow leaves out: it needs '
                             'network mode "allowlist" on the Linux backend')
        from stockade.cli.ask import terminal_approval

        backend = backend.with_approval(terminal_approval(ASK_SECONDS))
    selected = time.monotonic()
    if request.limits.pids is None and policy.limits.pids is not None:  # (once it will run)
        print(f"stockade: warning: limits.pids (the preset's {policy.limits.pids}) is not "
              "enforced: the landlock tier cannot limit root's processes (RLIMIT_NPROC does "
              "not bind uid 0); run as an ordinary user, or with isolation namespaces",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    global launched
    launched = True
    stopped = None
    if as_json:  # (Ctrl-C cancels the run, whose result is then printed, cancelled)
        with cancelled_by_signals() as stopped:
            result = execute(backend, request, cancel=stopped)
    else:
        result = execute(backend, request, stdio_inherit=True)
    if verbose:
        owner = {"compile": (compiled - started) * 1000, "readiness": (selected - compiled) * 1000}
        stages = ", ".join(f"{name} {ms:.1f}" for name, ms in {**owner, **result.timings}.items())
        if "namespaces" in result.enforced:  # (what the Linux sandbox's pid 1 applied)
            print(f"stockade: {result.backend} layers: {_layers(result.enforced)}",
                  file=sys.stderr)
        print(f"stockade: {result.backend} launch stages (ms): {stages}; "
              f"digest {result.digest[:16]}", file=sys.stderr)
    status = finish(result, as_json=as_json, log=log, overlay=request.workspace == "overlay")
    return status if stopped is None or stopped.signum is None else 128 + stopped.signum


def finish(result: Result, *, as_json: bool, log: TextIO | None = None,
           overlay: bool = False) -> int:
    """After a run: its network log appended to `log`, its JSON printed (`as_json`), its
    denials in words on stderr (not with STOCKADE_QUIET_DENIALS=1), and, for an `overlay`
    run, its pending changes;
    returns its exit status. The command has run, so a failure to write any of it is said
    in one line, and the status still returned."""
    if log is not None:
        try:
            log.writelines(json.dumps(entry) + "\n" for entry in result.network_log)
            log.flush()
        except OSError as exc:
            print(f"stockade: output_failed: the network log could not be written to "
                  f"{log.name} ({exc.strerror})", file=sys.stderr)
    if as_json:
        try:
            print(json.dumps(result.to_json()), flush=True)
        except BrokenPipeError:
            raise
        except OSError as exc:
            print(f"stockade: output_failed: the JSON result could not be written to stdout "
                  f"({exc.strerror})", file=sys.stderr)
            drop_stdout()
    if os.environ.get(QUIET) != "1":  # (what Stockade says of the run's denials)
        print_violations(result)
        if not as_json and result.exit_status != 0:
            print_host_code_note(result)
    if overlay and not as_json:
        print_pending(result)
    if result.exit_status == 0 and any(v.kind == OUTPUT_FAILED for v in result.violations):
        return EXIT_OUTPUT_FAILED  # (the command succeeded, but what it printed was lost)
    return result.exit_status


def _open_for_appending(path: str, flag: str) -> TextIO:
    """`path` opened to append to, before anything runs; UsageError (exit 2) naming it and
    why not, if it cannot be."""
    try:
        return open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by run_sandboxed)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot be opened for appending "
                         f"({exc.strerror})") from None


def _check_streams_open() -> None:
    """A closed stdout or stderr is refused before anything runs: what the command prints
    there would be lost without a word."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            raise UsageError(f"{name} is closed, so what the command prints there would be "
                             f"lost; redirect it (to /dev/null to drop it)") from None


def _check_stdout() -> None:
    """With --json the result goes to stdout: a closed or read-only stdout is refused before
    anything runs (there would be nowhere to say how the command ended). Windows has no way to
    ask a descriptor's access mode: there only a closed stdout is refused here."""
    closed = UsageError("--json: stdout is closed, so the result could not be printed; "
                        "redirect it to a file")
    try:
        os.fstat(1)
    except OSError:
        raise closed from None
    if not hasattr(os, "O_ACCMODE"):  # (Windows: no fcntl)
        return
    import fcntl

    try:
        mode = fcntl.fcntl(1, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        raise closed from None
    if mode == os.O_RDONLY:
        raise UsageError("--json: stdout is open only for reading, so the result could not "
                         "be printed; redirect it to a file")


def _layers(enforced: dict) -> str:
    """What the sandbox's pid 1 reported applying, in one line (names and numbers only)."""
    landlock = enforced.get("landlock", {})
    seccomp = enforced.get("seccomp", {})
    limits = ", ".join(sorted(enforced.get("limits", {})))
    return (f"namespaces {','.join(enforced.get('namespaces', []))}; "
            f"landlock ABI {landlock.get('abi', 0)}; "
            f"seccomp {seccomp.get('mode', 'off')} ({seccomp.get('denied_syscalls', 0)} denied); "
            f"limits {limits or 'none'}")


def print_pending(result: Result) -> None:
    """One stderr line: where a copy-on-write run's changes are, and what to do with them."""
    if result.changes is None:  # (nothing to review: nothing was kept)
        print("stockade: overlay: no changes", file=sys.stderr)
        return
    found = result.changes.changes()
    counts = ", ".join(f"{sum(c.kind == kind for c in found)} {kind}"
                       for kind in ("added", "modified", "deleted"))
    run = result.changes.id
    print(f"stockade: overlay: {counts}, kept as run {run}; review with `stockade changes "
          f"{run[:8]}`, then `stockade apply {run[:8]}` or `stockade discard {run[:8]}`",
          file=sys.stderr)


def print_host_code_note(result: Result) -> None:
    """After a failed run, one stderr line naming what of the write roots was read-only as
    code this host runs outside the sandbox: a write there fails with only "Read-only file
    system", which says nothing of why (attack 29 G5s)."""
    kept = result.enforced.get("host_code_read_only") or []
    if kept:
        shown = ", ".join(visible(path) for path in kept[:3]) + (", ..." if kept[3:] else "")
        print(f"stockade: note: read-only in this sandbox, as code this host runs outside it "
              f"(its interpreter, import path or imported modules): {shown}", file=sys.stderr)


def print_violations(result: Result) -> None:
    """What the sandbox denied or cut short, if anything, on stderr: the lines an
    integration's tool result ends with (launch/denials.py), each naming what and the
    policy grant that would allow it. On a terminal, its attributes are reset first: the
    command may have left them set to hide these lines (black on black: issue 34, D4)."""
    lines = denial_lines(denial(v) for v in result.violations)
    if lines and sys.stderr.isatty():
        sys.stderr.write(RESET)
    for line in lines:
        print(line, file=sys.stderr)
