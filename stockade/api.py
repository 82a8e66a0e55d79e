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
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import IO, Any, ParamSpec

from stockade.errors import UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import MERGE, SandboxManager
from stockade.launch.pump import DISCARD, KEEP, Sink
from stockade.launch.result import CommandFailed, CommandTimedOut, Result
from stockade.policy import Policy, merge, resolve_policy
from stockade.policy.units import parse_duration

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
SHELL = "/bin/sh"  # what shell=True runs, as subprocess does (it must be visible in the sandbox)

Args = Sequence[str | os.PathLike[str]] | str
Destination = int | IO[Any] | None

P = ParamSpec("P")


def run(
    args: Args,
    policy: Policy | str | os.PathLike[str] | None = None,
    *,
    preset: str | None = None,
    workspace: str | os.PathLike[str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | str | None = None,
    capture_output: bool | None = None,
    stdout: Destination = PIPE,
    stderr: Destination = PIPE,
    check: bool = False,
    text: bool | None = None,
    encoding: str | None = None,
    errors: str | None = None,
    env: Mapping[str, str | os.PathLike[str]] | None = None,
    timeout: float | str | None = None,
    shell: bool = False,
    backend: str | None = None,
    cancel: threading.Event | None = None,
    overlay: bool = False,
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
    `process.stdin = "inherit"`). Output is captured by default, within `limits.output` per
    stream (what comes beyond is dropped and flagged): unlike subprocess.run, whose default
    is to inherit. `stdout` and `stderr` each take PIPE (captured: the default), DEVNULL
    (read and dropped), None (relayed live to this process's own stdout or stderr), a
    descriptor or a file with fileno() (relayed into it), and for stderr STDOUT (into
    wherever stdout goes, interleaved as written). `capture_output=True` is PIPE for both;
    `capture_output=False` relays both instead. Whatever is not captured is None in the
    Result. Relayed output is copied by this process through a pipe: no descriptor of
    this process (a terminal, a file) ever enters the sandbox. With `text=True` (or an
    `encoding` or `errors`), `input` is a str and the captured output is decoded, with
    universal newlines, as subprocess does (default encoding: the locale's).

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
    StartError (the command could not be started).

    `overlay=True` (or `filesystem.workspace = "overlay"` in the policy) gives the command a
    copy-on-write workspace: its writes to its write roots are kept aside, and the Result's
    `changes` lists them (`added`, `modified`, `deleted`, `diff()`) until `apply()` lands them
    in the real workspace (refused, listing each, if the host changed meanwhile) or
    `discard()` drops them.

        >>> stockade.run(["python3", "-c", "print(1)"], preset="workspace-write").stdout
        b'1\\n'
    """
    argv = _argv(args, shell)
    chosen = resolve_policy(policy, preset)
    sinks = _sinks(capture_output, stdout, stderr)
    seconds = _seconds(timeout)
    encoding = _encoding(text, encoding, errors)
    data = _input(input, encoding, errors)
    if env:
        chosen = merge(chosen, {"env": {"set": _variables(env)}}, file="env=")
    if overlay:
        chosen = merge(chosen, {"filesystem": {"workspace": "overlay"}}, file="overlay=")
    request = compile_policy(chosen, argv, CompileContext.current(workspace), cwd=cwd)
    if seconds is not None:
        request = replace(request, limits=replace(request.limits, timeout=seconds))
    # (the manager chooses among the backends of the policy's containment: native or a VM)
    manager = SandboxManager(backend, "require" if backend else "auto")
    result = manager.run(request, input=data, cancel=cancel, stdout=sinks[0], stderr=sinks[1])
    result = _shaped(result, args, encoding, errors)
    if check:
        result.check_returncode()
    return result


def _argv(args: Args, shell: bool) -> list[str]:
    """The argv `args` amounts to (compile checks the rest and names what is wrong)."""
    if shell:
        if isinstance(args, str | os.PathLike):
            return [SHELL, "-c", os.fspath(args)]
        return [SHELL, "-c", *_words(args)]
    if isinstance(args, str | bytes):
        return args  # type: ignore[return-value]  (compile refuses it, saying shell=True)
    return _words(args)


def _words(args: Sequence[str | os.PathLike[str]]) -> list[str]:
    if isinstance(args, os.PathLike):  # one program, as subprocess takes it
        return [os.fspath(args)]
    try:
        return [os.fspath(arg) if isinstance(arg, os.PathLike) else arg for arg in args]
    except TypeError:
        raise UsageError(f"args must be a list of arguments, got {type(args).__name__}") from None


def _sinks(capture_output: bool | None, stdout: Destination,
           stderr: Destination) -> tuple[Sink, Sink]:
    if capture_output is not None and not isinstance(capture_output, bool):
        raise UsageError("capture_output must be True or False")
    if capture_output and (stdout != PIPE or stderr != PIPE):
        raise UsageError("stdout and stderr may not be given with capture_output=True")
    if capture_output is False:
        stdout = None if stdout == PIPE else stdout
        stderr = None if stderr == PIPE else stderr
    if stdout == STDOUT:
        raise UsageError("stdout=STDOUT means nothing: STDOUT is for stderr")
    return _sink(stdout, 1, "stdout"), MERGE if stderr == STDOUT else _sink(stderr, 2, "stderr")


def _sink(destination: Destination, own: int, name: str) -> Sink:
    if destination is None:
        destination = sys.stdout if own == 1 else sys.stderr
        if destination is None:  # (no such stream in this process: pythonw)
            return DISCARD
    if isinstance(destination, bool):
        raise UsageError(f"{name} must be PIPE, DEVNULL, None, a descriptor or a file")
    if destination == PIPE:
        return KEEP
    if destination == DEVNULL:
        return DISCARD
    if isinstance(destination, int) and destination >= 0:
        return destination
    try:
        destination.flush()  # type: ignore[union-attr]  (what it buffered comes first)
        return destination.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        raise UsageError(f"{name} must be PIPE, DEVNULL, None, a descriptor or a file with "
                         f"fileno(), got {type(destination).__name__}") from None


def _seconds(timeout: float | str | None) -> float | None:
    if timeout is None:
        return None
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise UsageError(f"timeout={timeout!r}: {exc} (seconds, or a duration "
                         "string)") from None


def _encoding(text: bool | None, encoding: str | None, errors: str | None) -> str | None:
    """The encoding of text mode, as subprocess chooses it; None: bytes."""
    if not (text or encoding or errors):
        return None
    if encoding is not None:
        return encoding
    import locale  # (it imports `re`, which the `stockade` command does without)

    return "utf-8" if sys.flags.utf8_mode else locale.getencoding()


def _input(data: bytes | str | None, encoding: str | None, errors: str | None) -> bytes | None:
    if data is None:
        return None
    if isinstance(data, str):
        if encoding is None:
            raise UsageError("input is a str: pass text=True (or an encoding) to send it "
                             "encoded, or give bytes")
        return data.encode(encoding, errors or "strict")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UsageError(f"input must be bytes (str in text mode), got {type(data).__name__}")
    return bytes(data)


def _variables(env: Mapping[str, str | os.PathLike[str]] | None) -> dict[str, Any]:
    """`env` with os.PathLike values as strings (the policy checks names and values)."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of names to values, got {type(env).__name__}")
    return {name: os.fspath(value) if isinstance(value, os.PathLike) else value
            for name, value in env.items()}


def _shaped(result: Result, args: Args, encoding: str | None, errors: str | None) -> Result:
    """`result` with the caller's `args`, and its captured output decoded in text mode."""
    changes: dict[str, Any] = {"args": args if isinstance(args, str) else list(_words(args))}
    if encoding is not None:
        for name in ("stdout", "stderr"):
            data = getattr(result, name)
            if isinstance(data, bytes):
                cut = getattr(result, f"{name}_truncated")
                changes[name] = _decoded(data, encoding, errors, complete=not cut)
    return replace(result, **changes)


def _decoded(data: bytes, encoding: str, errors: str | None, *, complete: bool) -> str:
    """As subprocess's text mode: decoded, universal newlines. Output cut at the limit may end
    inside a character: what is left of it is dropped, as the rest of the stream was."""
    import codecs

    decoder = codecs.getincrementaldecoder(encoding)(errors or "strict")
    text = decoder.decode(data, final=complete)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _in_a_thread(blocking: Callable[P, Result]) -> Callable[P, Coroutine[Any, Any, Result]]:
    """`blocking` for asyncio programs: it runs in a worker thread, and cancelling the
    awaiting task sets its `cancel` event, which kills the sandbox tree."""

    @functools.wraps(blocking)
    async def awaitable(*args: P.args, **kwargs: P.kwargs) -> Result:
        import asyncio  # only asyncio programs pay for importing it

        cancel = kwargs.get("cancel") or threading.Event()
        kwargs["cancel"] = cancel
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
