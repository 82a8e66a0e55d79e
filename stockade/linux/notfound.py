"""Why a command was not found in the sandbox, and what would make it visible.

execve answers ENOENT both when the program is missing and when the program is there but its
ELF interpreter (the dynamic loader) or its `#!` interpreter is not, and the supervisor can only
report `command_not_found` for argv[0]. After such a failure the owner looks again, on the host,
at the view the request describes: which roots hold what (each at its own path, a root's alias
as a link to it, the directories leading to a root), and where each symbolic link on the way
leads. It then names the first path that the sandbox lacks and the
policy key that would grant it. (A denied path is no cause: its mask answers EACCES, reported
as `command_not_executable`.) This reads the host's tree only to explain a failure that
already happened; nothing here decides what a sandbox may see.
"""

from __future__ import annotations

import copy
import os
import stat
import struct

from stockade.launch.compile import inside
from stockade.launch.request import LaunchRequest

DEFAULT_PATH = "/bin:/usr/bin"  # the supervisor's search path when the environment has none
_SPECIAL = ("/proc", "/dev")    # the sandbox's own; not explained from the host's
_PT_INTERP = 3
_MAX_LINKS = 40


def explain(request: LaunchRequest) -> str | None:
    """The message for `command_not_found` of `request.argv[0]`, or None to keep the
    supervisor's own."""
    view = _View(request)
    name = request.argv[0]
    env = dict(request.env)
    found = candidates(request)
    for candidate in found:
        if view.missing(candidate) is None and _is_program(candidate):
            return _interpreter_missing(view, name, candidate)
    on_host = next((c for c in found if _is_program(c)), None)
    if on_host is not None:
        missing = view.missing(on_host) or on_host
        return (f"{name}: {on_host} exists on the host but not in the sandbox: {missing} is in "
                f"no read or write root; {_grant(view, on_host, missing)}")
    if "/" in name:
        return f"{name}: no such file, in the sandbox or on the host"
    return (f"{name}: not found in the sandbox's PATH "
            f"({env.get('PATH', DEFAULT_PATH + ', the default')}), nor there on the host")


def candidates(request: LaunchRequest) -> list[str]:
    """Where the supervisor looks for argv[0], in its order: the path itself when it holds a
    "/" (from the working directory), else each entry of the command's PATH (the default
    when it has none; an empty entry is the working directory). Shown tidied ("./x" as the
    directory's "x")."""
    name = request.argv[0]
    if "/" in name:
        places = [os.path.join(request.cwd, name)]
    else:
        search = dict(request.env).get("PATH", DEFAULT_PATH)
        places = [os.path.join(entry or request.cwd, name) for entry in search.split(":")]
    return [os.path.normpath(place) for place in places]


def _interpreter_missing(view: _View, name: str, program: str) -> str | None:
    """The program exists in the view: say which interpreter of it does not, if one."""
    seen = set()
    while program not in seen:
        seen.add(program)
        found = _interpreter(program)
        if found is None:
            return None
        interpreter, kind = found
        missing = view.missing(interpreter)
        if missing is not None:
            return (f"{name}: {program} is there, but its {kind} {interpreter} is not visible in "
                    f"the sandbox: {missing} is in no read or write root; "
                    f"{_grant(view, interpreter, missing)}")
        program = interpreter
    return None


def _interpreter(path: str) -> tuple[str, str] | None:
    """(the interpreter `path` asks the kernel for, "ELF interpreter" or "#! interpreter")."""
    try:  # (not blocking: what a sandbox left there may have become a FIFO since)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            head = f.read(256)
            if head.startswith(b"#!"):
                words = head[2:].split(b"\n", 1)[0].split()
                return (os.fsdecode(words[0]), "#! interpreter") if words else None
            if head.startswith(b"\x7fELF"):
                loader = _elf_interpreter(f, head)
                return None if loader is None else (loader, "ELF interpreter (loader)")
    except OSError:
        pass
    return None


def _elf_interpreter(f, head: bytes) -> str | None:
    """PT_INTERP of an ELF file (None for a static program)."""
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    header = struct.Struct(order + ("16xHHIQQQIHHH" if wide else "16xHHIIIIIHHH"))
    if len(head) < header.size:
        return None
    fields = header.unpack_from(head)
    phoff, phentsize, phnum = fields[4], fields[8], fields[9]
    entry = struct.Struct(order + ("IIQQQQQQ" if wide else "IIIIIIII"))
    for index in range(min(phnum, 256)):
        f.seek(phoff + index * phentsize)
        raw = f.read(entry.size)
        if len(raw) < entry.size:
            return None
        values = entry.unpack(raw)
        if values[0] == _PT_INTERP:
            offset, size = (values[2], values[5]) if wide else (values[1], values[4])
            f.seek(offset)
            return os.fsdecode(f.read(min(size, 4096)).split(b"\0", 1)[0])
    return None


def _is_program(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode) and os.access(path, os.X_OK)
    except OSError:
        return False


def _grant(view: _View, wanted: str, missing: str) -> str:
    """What to add to make `wanted` visible: the directory that holds it, when that alone
    does (its parents appear as a root's do), else each missing path in turn (a link, such
    as /lib -> usr/lib, appears only when it is granted by that name)."""
    holder = os.path.dirname(os.path.realpath(wanted))
    if view.with_root(holder).missing(wanted) is None:
        roots = [holder]
    else:
        roots = [missing]
        while (still := view.with_root(*roots).missing(wanted)) is not None:
            if still in roots or len(roots) == _MAX_LINKS:
                break
            roots.append(still)
    flags = " ".join(f"--read {root}" for root in roots)
    return f"add {' and '.join(roots)} to filesystem.read (stockade run {flags})"


class _View:
    """The sandbox's tree as the request describes it, read against the host's."""

    def __init__(self, request: LaunchRequest) -> None:
        roots = request.read + request.write
        self.roots = [g.path for g in roots]
        self.aliases = {g.alias: g.path for g in roots if g.alias != g.path}

    def missing(self, path: str) -> str | None:
        """The first path the sandbox lacks on the way to `path` (symbolic links followed as
        the sandbox would), or None if `path` resolves there."""
        pending = [part for part in path.split("/") if part][::-1]
        current, hops = "/", 0
        while pending:
            part = pending.pop()
            if part in (".", ""):
                continue
            if part == "..":
                current = os.path.dirname(current)
                continue
            step = os.path.join(current, part)
            if any(inside(step, own) for own in _SPECIAL) and self._held(step) is None:
                return None  # (the sandbox's own /proc and /dev: not explained)
            target = self._link(step)
            if target is None:
                if not self._present(step):
                    return step
                current = step
                continue
            hops += 1
            if hops > _MAX_LINKS:
                return step
            if target.startswith("/"):
                current = "/"
            pending += [p for p in target.split("/") if p][::-1]
        return None

    def with_root(self, *paths: str) -> _View:
        """This view with `paths` read roots too (granted by those names)."""
        wider = copy.copy(self)
        for path in paths:
            canonical = os.path.realpath(path)
            wider.roots = [*wider.roots, canonical]
            if path != canonical:
                wider.aliases = {**wider.aliases, path: canonical}
        return wider

    def _held(self, path: str) -> str | None:
        return next((root for root in self.roots if inside(path, root)), None)

    def _present(self, path: str) -> bool:
        if self._held(path) is not None:
            return os.path.lexists(path)
        return path in self.aliases or any(
            inside(root, path) for root in (*self.roots, *self.aliases))

    def _link(self, path: str) -> str | None:
        """Where `path` leads if it is a symbolic link in the view, else None."""
        if path in self.aliases and self._held(path) is None:
            return self.aliases[path]
        if self._held(path) is None:
            return None
        try:
            return os.readlink(path)
        except OSError:
            return None
