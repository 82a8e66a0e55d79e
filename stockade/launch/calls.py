"""The arguments of the subprocess-shaped calls (`stockade.run`, `arun`, and a Sandbox's
`run`, `arun` and `stream`), checked the one way for all of them, and their Result shaped as the
caller asked. A mistake is a UsageError naming the argument, never a raw Python error."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import IO, Any

from stockade.errors import UsageError
from stockade.launch.manager import MERGE
from stockade.launch.pump import DISCARD, KEEP, Sink
from stockade.launch.result import Result
from stockade.policy.units import parse_duration

PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
SHELL = "/bin/sh"  # what shell=True runs, as subprocess does (it must be visible in the sandbox)

Args = Sequence[str | os.PathLike[str]] | str
Destination = int | IO[Any] | None


@dataclass(frozen=True)
class Stdin:
    """What the command reads: `data` (bytes, then EOF), or `mode` "null" / "inherit" (None:
    the policy's), relayed from this process's descriptor `source`."""

    data: bytes | None = None
    mode: str | None = None
    source: int = 0


def argv(args: Args, shell: bool) -> list[str]:
    """The argv `args` amounts to (compile checks the rest and names what is wrong)."""
    if shell:
        if isinstance(args, str | os.PathLike):
            return [SHELL, "-c", os.fspath(args)]
        return [SHELL, "-c", *words(args)]
    if isinstance(args, str | bytes):
        return args  # type: ignore[return-value]  (compile refuses it, saying shell=True)
    return words(args)


def words(args: Sequence[str | os.PathLike[str]]) -> list[str]:
    if isinstance(args, os.PathLike):  # one program, as subprocess takes it
        return [os.fspath(args)]
    try:
        return [os.fspath(arg) if isinstance(arg, os.PathLike) else arg for arg in args]
    except TypeError:
        raise UsageError(f"args must be a list of arguments, got {type(args).__name__}") from None


def sinks(capture_output: bool | None, stdout: Destination,
          stderr: Destination) -> tuple[Sink, Sink]:
    """Where stdout and stderr go: pump.KEEP, pump.DISCARD, a descriptor, or (stderr) MERGE."""
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
        return _writable(destination, name)
    try:
        destination.flush()  # type: ignore[union-attr]  (what it buffered comes first)
        fd = destination.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        raise UsageError(f"{name} must be PIPE, DEVNULL, None, a descriptor or a file with "
                         f"fileno(), got {type(destination).__name__}") from None
    return _writable(fd, name)


def _writable(fd: int, name: str) -> int:
    """`fd`, once it is known to be open for writing (the output would be lost otherwise,
    with the command already run)."""
    try:
        os.fstat(fd)
    except OSError as exc:
        raise UsageError(f"{name}={fd}: not an open descriptor of this process "
                         f"({exc.strerror})") from None
    if hasattr(os, "O_ACCMODE"):  # (Windows: no way to ask a descriptor's access mode)
        import fcntl

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise UsageError(f"{name}={fd}: open only for reading, so the output could not "
                             "be written to it")
    return fd


def stdin(stdin: Destination, data: bytes | str | None, encoding: str | None,
          errors: str | None, *, relay: bool = True) -> Stdin:
    """The command's stdin from `stdin` (as subprocess takes it) and `input`: None (the
    policy's process.stdin, else /dev/null), DEVNULL, PIPE (nothing written: EOF, as
    subprocess.run does), or a descriptor or file (relayed through a pipe, if `relay`)."""
    given = _input(data, encoding, errors)
    if stdin is None:
        return Stdin(given)
    if given is not None:
        raise UsageError("stdin and input may not both be used")
    if isinstance(stdin, bool):
        raise UsageError("stdin must be None, PIPE, DEVNULL, a descriptor or a file")
    if stdin == DEVNULL:
        return Stdin(mode="null")
    if stdin == PIPE:
        return Stdin(b"")
    if stdin == STDOUT:
        raise UsageError("stdin=STDOUT means nothing: STDOUT is for stderr")
    try:
        fd = stdin if isinstance(stdin, int) else stdin.fileno()  # type: ignore[union-attr]
        os.fstat(fd)
    except (AttributeError, OSError, ValueError):
        raise UsageError(f"stdin must be None, PIPE, DEVNULL, an open descriptor or a file "
                         f"with fileno(), got {stdin!r:.60}") from None
    if not relay:
        raise UsageError("a Sandbox command takes no descriptor as stdin: pass its data as "
                         "input (bytes; str in text mode)")
    return Stdin(mode="inherit", source=fd)


def _input(data: bytes | str | None, encoding: str | None, errors: str | None) -> bytes | None:
    if data is None:
        return None
    if isinstance(data, str):
        if encoding is None:
            raise UsageError("input is a str: pass text=True (or an encoding) to send it "
                             "encoded, or give bytes")
        try:
            return data.encode(encoding, errors or "strict")
        except UnicodeEncodeError as exc:
            raise UsageError(f"input cannot be encoded as {encoding} ({exc.reason} at "
                             f"character {exc.start}): pass errors= or bytes") from None
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UsageError(f"input must be bytes (str in text mode), got {type(data).__name__}")
    return bytes(data)


def seconds(timeout: float | str | None) -> float | None:
    if timeout is None:
        return None
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise UsageError(f"timeout={timeout!r}: {exc} (seconds, or a duration "
                         "string)") from None


def encoding(text: bool | None, encoding: str | None, errors: str | None,
             universal_newlines: bool | None = None) -> str | None:
    """The encoding of text mode, as subprocess chooses it; None: bytes. Both are looked up
    now: an unknown one is refused before anything runs."""
    if universal_newlines is not None:  # (subprocess's older name for text)
        if text is not None and bool(text) != bool(universal_newlines):
            raise UsageError("text and universal_newlines differ: give only text")
        text = universal_newlines
    if not (text or encoding or errors):
        return None
    import codecs

    for value, lookup, name in ((encoding, codecs.lookup, "encoding"),
                                (errors, codecs.lookup_error, "errors")):
        if value is None:
            continue
        try:
            lookup(value)
        except (LookupError, TypeError):
            raise UsageError(f"{name}={value!r:.60}: no such {name} handler"
                             if name == "errors" else f"encoding={value!r:.60}: no such "
                             "encoding") from None
    if encoding is not None:
        return encoding
    import locale  # (it imports `re`, which the `stockade` command does without)

    return "utf-8" if sys.flags.utf8_mode else locale.getencoding()


def variables(env: Mapping[str, str | os.PathLike[str]] | None) -> dict[str, Any]:
    """`env` with os.PathLike values as strings (the policy checks names and values)."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of names to values, got {type(env).__name__}")
    return {name: os.fspath(value) if isinstance(value, os.PathLike) else value
            for name, value in env.items()}


def cancel_event(cancel: object) -> threading.Event | None:
    if cancel is not None and not (hasattr(cancel, "is_set") and hasattr(cancel, "set")):
        raise UsageError(f"cancel must be a threading.Event, got {type(cancel).__name__}")
    return cancel  # type: ignore[return-value]


def shaped(result: Result, args: Args, encoding: str | None, errors: str | None) -> Result:
    """`result` with the caller's `args`, and its captured output decoded in text mode. Output
    that is not text in `encoding` is a UsageError carrying the Result (`.result`): the
    command has run."""
    changes: dict[str, Any] = {"args": args if isinstance(args, str) else list(words(args))}
    if encoding is not None:
        for name in ("stdout", "stderr"):
            data = getattr(result, name)
            if isinstance(data, bytes):
                cut = getattr(result, f"{name}_truncated")
                try:
                    changes[name] = decoded(data, encoding, errors, complete=not cut)
                except UnicodeDecodeError as exc:
                    error = UsageError(f"{name} is not {encoding} text (byte {exc.start}: "
                                       f"{exc.reason}): pass errors='replace', or read bytes "
                                       "(no text=); the Result is this error's .result")
                    error.result = replace(result, **changes)  # type: ignore[attr-defined]
                    raise error from None
    return replace(result, **changes)


def decoded(data: bytes, encoding: str, errors: str | None, *, complete: bool) -> str:
    """As subprocess's text mode: decoded, universal newlines. Output cut at the limit may end
    inside a character: what is left of it is dropped, as the rest of the stream was."""
    import codecs

    decoder = codecs.getincrementaldecoder(encoding)(errors or "strict")
    text = decoder.decode(data, final=complete)
    return text.replace("\r\n", "\n").replace("\r", "\n")
