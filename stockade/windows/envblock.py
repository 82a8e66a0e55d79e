"""The environment block CreateProcessW takes with CREATE_UNICODE_ENVIRONMENT.

`NAME=value` strings, each ended by NUL, the block ended by one more NUL; sorted by name without
regard to case, as Windows requires: names compare as upper-cased UTF-16 code units, the way the
system compares them (hostpaths.upcase). Windows treats names case-insensitively, so two names
differing only in case are refused rather than one silently replacing the other; so are names
that are empty, hold `=` (including the `=C:`-style per-drive directories cmd.exe keeps) or
NUL, and values holding NUL. Error messages name the variable, never its value.
"""

from __future__ import annotations

from stockade.launch.hostpaths import upcase


def with_temp(env: tuple[tuple[str, str], ...], temp: str) -> tuple[tuple[str, str], ...]:
    """`env` with TEMP and TMP set to `temp` (the launch's AppContainer's own temp folder)
    where it does not name them: the owner's are outside every root, and without either a
    program falls back to a place of its own choosing (Python's tempfile: the working
    directory, the workspace)."""
    named = {name.upper() for name, _ in env}
    return (*env, *((name, temp) for name in ("TEMP", "TMP") if name not in named))


def environment_block(env: tuple[tuple[str, str], ...]) -> str:
    """The block for `env` (name, value) pairs; ValueError naming the first bad variable."""
    seen: dict[str, str] = {}
    for name, value in env:
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"variable name {name[:64]!r} is not valid on Windows")
        if "\0" in value:
            raise ValueError(f"variable {name} has a NUL in its value")
        other = seen.setdefault(upcase(name), name)
        if other != name:
            raise ValueError(f"variables {other} and {name} differ only in case; "
                             "Windows would keep one of them")
    ordered = sorted(env, key=lambda pair: upcase(pair[0]))
    return "".join(f"{name}={value}\0" for name, value in ordered) + "\0"
