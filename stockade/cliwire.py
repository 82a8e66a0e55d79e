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


def socket_path() -> str:
    """Where the CLI server listens (stockade/lifecycle/statedir.py says where that is)."""
    from stockade.lifecycle import statedir

    return os.path.join(statedir.state_dir(), SOCKET_NAME)


def program_facts() -> list[str]:
    """What of this program its host code is judged from (stockade/launch/hostcode.py), and
    what makes its imports what they are: its interpreter, prefixes, Stockade's package
    directory, the flags that change the import path (-I -E -s -S -P), how it was started
    (sys.orig_argv), its script (sys.argv[0]) and its import path. The server runs a request
    only for a program whose interpreter, prefixes, package and flags are its own, and judges
    the host code of the run from these (a served run keeps what a run here would keep)."""
    import sys

    import stockade

    flags = sys.flags
    return [sys.executable, sys.prefix, sys.base_prefix, os.path.dirname(stockade.__file__),
            "".join(str(int(bool(flag))) for flag in (
                flags.isolated, flags.ignore_environment, flags.no_user_site, flags.no_site,
                flags.safe_path)),
            sys.argv[0] if sys.argv else "",
            str(len(sys.orig_argv)), *sys.orig_argv, str(len(sys.path)), *sys.path]


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
