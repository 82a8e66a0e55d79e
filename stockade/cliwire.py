"""The CLI server's wire, both ends of it: what it serves, where it listens, how a request is
framed and what it answers a caller it does not serve. The client is stockade/program.py, the
server stockade/cli/server.py (which decodes what `encode_request` encodes).

This is on `stockade run`'s fast path through the server: it imports only os and struct.
"""

from __future__ import annotations

import os
import struct

SERVED = ("run", "sandbox-exec", "exec")  # the command lines the CLI server runs
SOCKET_NAME = "cli.sock"  # in the state directory
NOT_SERVED = b"here\n"  # the server's answer to a caller whose context is not its own
CANCEL = b"C"  # the client's one byte after its request: Ctrl-C was pressed there
# ... or SIGINT reached a client that inherited it ignored (a script's background job): the
# server's child takes it only where the command line takes SIGINT itself, as it would here
CANCEL_IF_TAKEN = b"c"
FACTS = "--program-facts"  # a request's first word: the client program's facts follow
IDLE_ENV = "STOCKADE_SERVER_IDLE"  # how long a server a run started waits (cli/autoserver.py)
# A module's origin that names no file: no host code of its own. (`_frozen_importlib` is one
# until something imports `importlib`, which a thin client need not do and the server has.)
FILELESS = ("built-in", "frozen")


def socket_path() -> str:
    """Where the CLI server listens (stockade/lifecycle/statedir.py says where that is)."""
    from stockade.lifecycle import statedir

    return os.path.join(statedir.state_dir(), SOCKET_NAME)


def program_facts() -> list[str]:
    """What of this program its host code is judged from (stockade/launch/hostcode.py), and
    what makes its imports what they are: its interpreter, prefixes, Stockade's package
    directory, the flags that change the import path (-I -E -s -S -P), its script
    (sys.argv[0]), where it started, its bytecode cache prefix, its user site; then, counted,
    how it was started (sys.orig_argv), its import path, the files of the modules it imported,
    its import finders and path hooks, and the places its imports searched. The server runs a
    request only for a program that imports as it does (the same interpreter, prefixes,
    package, flags, cache prefix and user site; nothing imported nor any finder it has not),
    and judges the run's host code from these: a served run keeps what a run here would."""
    fixed, lists = program_parts()
    return [*fixed, *(word for listed in lists for word in (str(len(listed)), *listed))]


def program_parts() -> tuple[list[str], list[list[str]]]:
    """`program_facts` before it is flattened: the nine single facts, and the five lists."""
    import sys

    import stockade

    flags = sys.flags
    site = sys.modules.get("site")
    # (what lies in the interpreter's prefixes or Stockade's package is kept with them, the
    # script is argv0)
    package = os.path.dirname(stockade.__file__)
    prefixes = tuple(os.path.join(prefix, "") for prefix in {
        sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, package})
    modules = sorted({where for name, module in list(sys.modules.items()) if name != "__main__"
                      and isinstance(where := getattr(module, "__file__", None) or getattr(
                          getattr(module, "__spec__", None), "origin", None), str)
                      and not where.startswith(prefixes) and where not in FILELESS})
    finders = [_named(finder) for finder in (*sys.meta_path, *sys.path_hooks)]
    searched = [key for key in list(sys.path_importer_cache) if isinstance(key, str)]
    return ([sys.executable, sys.prefix, sys.base_prefix, package,
             "".join(str(int(bool(flag))) for flag in (
                 flags.isolated, flags.ignore_environment, flags.no_user_site, flags.no_site,
                 flags.safe_path)),
             sys.argv[0] if sys.argv else "", stockade._started_in or "",
             sys.pycache_prefix or "", user_site(site)],
            [list(sys.orig_argv), list(sys.path), modules, finders, searched])


def user_site(site: object) -> str:
    """The user site the `site` module (or None: -S) read, and whether it reads one."""
    return "|".join(str(getattr(site, name, None))
                    for name in ("ENABLE_USER_SITE", "USER_BASE", "USER_SITE"))


def _named(finder: object) -> str:
    """An import finder or path hook by its class's (a function's own) qualified name."""
    kind = finder if hasattr(finder, "__qualname__") else type(finder)  # (an instance has none)
    return f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"


def encode_request(argv: list[str], cwd: str, umask: int, env: dict[bytes, bytes],
                   facts: list[str]) -> bytes:
    """A 4-byte length, then NUL-terminated fields: the number of words, the words — FACTS,
    the program's `facts` (`program_facts`), then its argv —, the working directory, the
    umask (octal), then `NAME=VALUE` per variable (none of them can contain a NUL). Nothing in
    it says who the caller is: the server asks the kernel. (A server that knows no FACTS
    answers NOT_SERVED: the first word is none of SERVED.)"""
    words = [FACTS, *facts, *argv]
    fields = [str(len(words)).encode(), *map(os.fsencode, words), os.fsencode(cwd),
              f"{umask:o}".encode(), *(name + b"=" + value for name, value in env.items())]
    body = b"".join(field + b"\0" for field in fields)
    return struct.pack("<I", len(body)) + body
