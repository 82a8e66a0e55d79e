"""From argv to what CreateProcessW takes: one command line, and the program to run.

A Windows program receives a single string and splits it itself. `command_line` quotes argv so
that the splitting rules of CommandLineToArgvW and of the Microsoft C runtime (the same rules for
everything this function produces) give back exactly argv:

- argv[0] is read up to the next `"` if it starts with one, else up to the first space or tab;
  backslashes are literal there, so an argv[0] holding `"` cannot be passed (ValueError).
- Other arguments are left bare unless empty or holding a space, tab, newline, vertical tab or
  `"`; then they are wrapped in quotes, every `"` becomes `\\"` and the backslashes before a
  `"` (or before the closing quote) are doubled.

The cmd.exe caveat: cmd.exe (and therefore every `.bat`/`.cmd` file) does not use these rules. It
reads the rest of its command line itself, where `\\"` is not an escape and `&`, `|`, `<`, `>`,
`^` and `%` outside its own idea of quotes are operators. An argument holding `"` can therefore
end cmd's quoting early: argv `["cmd.exe", "/d", "/c", "echo", 'x" & whoami & "']` becomes
`cmd.exe /d /c echo "x\\" & whoami & \\""`, in which cmd runs `whoami`. Inside the sandbox that is
only the sandboxed command doing more, never an escape; callers that build a cmd.exe line from
untrusted text must quote for cmd.exe themselves.

`resolve_program` finds the program to pass as lpApplicationName, so that CreateProcessW never
searches on its own (its search includes the *parent's* current directory and PATH): only the
sandbox's own PATH is searched, never the current directory.
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable

from stockade.errors import StartError

_NEEDS_QUOTES = frozenset(' \t\n\v"')
DEFAULT_PATHEXT = ".COM;.EXE;.BAT;.CMD"


def command_line(argv: tuple[str, ...] | list[str]) -> str:
    """The command line whose parsing gives `argv` back; ValueError if none does."""
    if not argv or not argv[0]:
        raise ValueError("argv[0] must not be empty")
    if any("\0" in arg for arg in argv):
        raise ValueError("arguments must not contain NUL")
    if '"' in argv[0]:
        raise ValueError('argv[0] cannot contain a double quote on Windows')
    first = f'"{argv[0]}"' if any(c in " \t" for c in argv[0]) else argv[0]
    return " ".join([first, *(_quote(arg) for arg in argv[1:])])


def _quote(arg: str) -> str:
    if arg and not _NEEDS_QUOTES.intersection(arg):
        return arg
    out, backslashes = ['"'], 0
    for char in arg:
        if char == "\\":
            backslashes += 1
            continue
        if char == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + char)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)


def resolve_program(argv0: str, cwd: str, env: tuple[tuple[str, str], ...],
                    is_file: Callable[[str], bool]) -> str:
    """The absolute path CreateProcessW should run for `argv0`: relative to `cwd` if it names a
    directory, else searched in the sandbox's PATH (with PATHEXT when it has no extension)."""
    variables = {name.upper(): value for name, value in env}
    extensions = [e for e in variables.get("PATHEXT", DEFAULT_PATHEXT).split(";") if e]
    named = bool(ntpath.dirname(argv0) or ntpath.splitdrive(argv0)[0])
    if named:
        directories = [ntpath.dirname(ntpath.join(cwd, argv0))]
    else:
        directories = [d for d in variables.get("PATH", "").split(";") if ntpath.isabs(d)]
    name = ntpath.basename(argv0)
    names = [name] if ntpath.splitext(name)[1] else [name + ext for ext in extensions]
    for directory in directories:
        for candidate in names:
            path = ntpath.normpath(ntpath.join(directory, candidate))
            if is_file(path):
                return path
    raise StartError("command_not_found", f"{argv0}: no such program" if named
                     else f"{argv0}: not found on the sandbox's PATH")
