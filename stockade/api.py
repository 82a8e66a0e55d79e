"""The Python API: `run` and `arun`, shaped like subprocess.run.

    >>> import stockade
    >>> r = stockade.run(["sh", "-c", "echo hi; cat /etc/shadow"], preset="read-only")
    >>> r.returncode, r.stdout
    (1, b'hi\\n')
    >>> stockade.run(["echo", "hi"], text=True, check=True).stdout
    'hi\\n'

Where it differs from subprocess.run, it does so to stay a sandbox: output is captured unless
asked otherwise, and what is not captured is copied through a pipe (no descriptor of this
process enters the sandbox); stdin is /dev/null unless `input` is given (or the policy says
`process.stdin = "inherit"`); `env` adds to the policy's closed environment instead of
replacing it; a timeout kills the whole sandbox tree and returns a Result (it raises only with
`check=True`); and nothing ever runs outside the sandbox.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, ParamSpec

from stockade.launch import calls
from stockade.launch.calls import DEVNULL, PIPE, STDOUT, Args, Destination
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import SandboxManager
from stockade.launch.result import CommandFailed, CommandTimedOut, Result
from stockade.net.approve import DEFAULT_TIMEOUT, Approval, Ask, on_loop
from stockade.policy import Policy, merge, resolve_policy

P = ParamSpec("P")


def run(
    args: Args,
    policy: Policy | str | os.PathLike[str] | None = None,
    *,
    preset: str | None = None,
    workspace: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | str | None = None,
    stdin: Destination = None,
    capture_output: bool | None = None,
    stdout: Destination = PIPE,
    stderr: Destination = PIPE,
    check: bool = False,
    text: bool | None = None,
    encoding: str | None = None,
    errors: str | None = None,
    universal_newlines: bool | None = None,
    env: Mapping[str, str | os.PathLike[str]] | None = None,
    timeout: float | str | None = None,
    shell: bool = False,
    backend: str | None = None,
    cancel: threading.Event | None = None,
    overlay: bool = False,
    approve: Callable[[Ask], str] | None = None,
    approve_timeout: float = DEFAULT_TIMEOUT,
) -> Result:
    """Run `args` in a fresh sandbox and return its Result, as subprocess.run returns a
    CompletedProcess (`returncode`, `args`, `stdout`, `stderr`, `check_returncode()`).

    `args` is a list of arguments (str or os.PathLike; an empty string is an argument); a
    string is refused unless `shell=True`, which runs it with /bin/sh -c (a list with
    `shell=True`: its first item is the script, the rest the shell's $0, $1, ...).

    The sandbox: `policy` is a Policy, or the path of a TOML/JSON policy file; otherwise
    `preset` names one (default "read-only"). `workspace` is what `{workspace}` means
    (default: the current directory); `cwd` the command's working directory (default: the
    policy's `process.cwd`, else the workspace). Both may be os.PathLike. A policy with
    `containment = "vm"` runs in a fresh VM guest (see docs/vm.md).

    Input and output: `input` (bytes; str in text mode) is the command's stdin, which is
    otherwise /dev/null (or this process's stdin, relayed, if the policy says
    `process.stdin = "inherit"`). `stdin` takes what subprocess's does: None (that default),
    DEVNULL, PIPE (nothing is written: the command reads EOF, as with subprocess.run), or a
    descriptor or a file with fileno(), relayed through a pipe (never handed to the
    sandbox); not together with `input`. Output is captured by default, within `limits.output` per
    stream (what comes beyond is dropped and flagged): unlike subprocess.run, whose default
    is to inherit. `stdout` and `stderr` each take PIPE (captured: the default), DEVNULL
    (read and dropped), None (relayed live to this process's own stdout or stderr), a
    descriptor or a file with fileno() (relayed into it), and for stderr STDOUT (into
    wherever stdout goes, interleaved as written). `capture_output=True` is PIPE for both;
    `capture_output=False` relays both instead. Whatever is not captured is None in the
    Result. Relayed output is copied by this process through a pipe: no descriptor of
    this process (a terminal, a file) ever enters the sandbox. With `text=True` (or an
    `encoding` or `errors`), `input` is a str and the captured output is decoded, with
    universal newlines, as subprocess does (default encoding: the locale's;
    `universal_newlines` is text's older name). Captured output that does not decode raises
    UsageError, with the Result as its `.result`.

    `env` adds variables to the policy's closed environment (it does not replace it):
    names the policy refuses (loader injection, credential-looking) are refused here too,
    by name, never showing a value. Values may be os.PathLike.

    `timeout` (a number of seconds, or a duration such as "90s" or "1m30s") overrides
    `limits.timeout`. When it expires the whole sandbox tree is killed and the Result says
    so: `timed_out=True`, `returncode` -9, a `limits.timeout` violation. With `check=True`,
    a command that did not exit 0 raises CommandFailed (a subprocess.CalledProcessError,
    with the Result as `.result`), and a timed-out one CommandTimedOut (also a
    subprocess.TimeoutExpired). Setting the `cancel` event kills the sandbox tree (the
    Result then has `cancelled=True`).

    Errors of the sandbox itself are StockadeError subclasses with a stable `.code`:
    UsageError (a wrong argument), PolicyError (a bad policy, a refused variable),
    UnavailableError / UnenforceableError (cannot sandbox here: nothing ran), SetupError,
    StartError (the command could not be started; a missing program raises CommandNotFound,
    which is also a FileNotFoundError, as subprocess raises).

    `overlay=True` (or `filesystem.workspace = "overlay"` in the policy) gives the command a
    copy-on-write workspace: its writes to its write roots are kept aside, and the Result's
    `changes` lists them (`added`, `modified`, `deleted`, `diff()`) until `apply()` lands them
    in the real workspace (refused, listing each, if the host changed meanwhile) or
    `discard()` drops them.

    `approve` (network.mode "allowlist"; the Linux backend) is asked, while the command runs,
    about each destination network.allow leaves out: it gets a `stockade.Ask` (host, port,
    reason, the names of the credentials of that host) and answers "allow-once",
    "allow-run" (that host and port for the rest of the run) or "deny"; no answer within
    `approve_timeout` seconds, or an exception, is "deny". A deny pattern is never asked about,
    and an approval lifts no address check. Approvals are in the Result's `network_log`.

        >>> stockade.run(["python3", "-c", "print(1)"], preset="workspace-write").stdout
        b'1\\n'
    """
    argv = calls.argv(args, shell)
    chosen = resolve_policy(policy, preset)
    sinks = calls.sinks(capture_output, stdout, stderr)
    seconds = calls.seconds(timeout)
    encoding = calls.encoding(text, encoding, errors, universal_newlines)
    given = calls.stdin(stdin, input, encoding, errors)
    cancel = calls.cancel_event(cancel)
    if env:
        chosen = merge(chosen, {"env": {"set": calls.variables(env)}}, file="env=")
    if overlay:
        chosen = merge(chosen, {"filesystem": {"workspace": "overlay"}}, file="overlay=")
    request = compile_policy(chosen, argv, CompileContext.current(workspace), cwd=cwd,
                             stdin=given.mode)
    if seconds is not None:
        request = replace(request, limits=replace(request.limits, timeout=seconds))
    # (the manager chooses among the backends of the policy's containment: native or a VM)
    manager = SandboxManager(backend, "require" if backend else "auto")
    result = manager.run(request, input=given.data, cancel=cancel, stdout=sinks[0],
                         stderr=sinks[1], stdin_from=given.source,
                         approval=None if approve is None else Approval(approve,
                                                                         approve_timeout))
    result = calls.shaped(result, args, encoding, errors)
    if check:
        result.check_returncode()
    return result


def _in_a_thread(blocking: Callable[P, Result]) -> Callable[P, Coroutine[Any, Any, Result]]:
    """`blocking` for asyncio programs: it runs in a worker thread, and cancelling the
    awaiting task sets its `cancel` event, which kills the sandbox tree."""

    @functools.wraps(blocking)
    async def awaitable(*args: P.args, **kwargs: P.kwargs) -> Result:
        import asyncio  # only asyncio programs pay for importing it

        cancel = kwargs.get("cancel") or threading.Event()
        kwargs["cancel"] = cancel
        if kwargs.get("approve") is not None:
            kwargs["approve"] = on_loop(kwargs["approve"])  # type: ignore[arg-type]
        task = asyncio.ensure_future(asyncio.to_thread(blocking, *args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.set()  # type: ignore[union-attr]
            await asyncio.wait([task])  # the tree is gone before the cancellation propagates
            raise

    return awaitable


arun = _in_a_thread(run)
arun.__name__ = arun.__qualname__ = "arun"
arun.__doc__ = """`run` for asyncio programs: the same arguments and Result, awaited.

    >>> result = await stockade.arun(["make"], "policy.toml", timeout=600)

Cancelling the awaiting task kills the sandbox tree (and the cancellation propagates once it
is gone); with `check=True` a failed command raises CommandFailed and a timed-out one
CommandTimedOut (a subprocess.TimeoutExpired too), as `run` does.
"""

__all__ = ["DEVNULL", "PIPE", "STDOUT", "CommandFailed", "CommandTimedOut", "arun",
           "resolve_policy", "run"]
