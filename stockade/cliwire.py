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


def socket_path() -> str:
    """Where the CLI server listens (stockade/lifecycle/statedir.py says where that is)."""
    from stockade.lifecycle import statedir

    return os.path.join(statedir.state_dir(), SOCKET_NAME)


def encode_request(argv: list[str], cwd: str, umask: int, env: dict[bytes, bytes]) -> bytes:
    """A 4-byte length, then NUL-terminated fields: the number of argv words, the words, the
    working directory, the umask (octal), then `NAME=VALUE` per variable (none of them can
    contain a NUL). Nothing in it says who the caller is: the server asks the kernel."""
    fields = [str(len(argv)).encode(), *map(os.fsencode, argv), os.fsencode(cwd),
              f"{umask:o}".encode(), *(name + b"=" + value for name, value in env.items())]
    body = b"".join(field + b"\0" for field in fields)
    return struct.pack("<I", len(body)) + body
