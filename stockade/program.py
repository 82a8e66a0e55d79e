"""The `stockade` program (bin/stockade, installed as the `stockade` command, and
`python -m stockade`).

`stockade run` and `stockade sandbox-exec` go to the CLI server when `stockade daemon` runs one
(stockade/cli/server.py): this process then imports almost nothing, passes its argv, working
directory, environment and standard streams, and exits with the status the server reports.
Everything else, and every run when no server answers, is the ordinary command line in this
process (stockade/cli).
"""

from __future__ import annotations

# _socket is the C module, not socket.py: the wrapper's own imports (enum, selectors) would
# cost about as much as the rest of this program's start.
import _socket
import os
import struct
import sys

SERVED = ("run", "sandbox-exec")
SOCKET_NAME = "cli.sock"  # in the state directory
EXIT_SETUP = 70
EXIT_INTERRUPTED = 130
NOT_SERVED = b"here\n"  # the server's answer to a caller whose context is not its own
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
_CONFINEMENT = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
                "Seccomp_filters")


def socket_path() -> str:
    """Where the CLI server listens (stockade/lifecycle/statedir.py says where that is)."""
    from stockade.lifecycle import statedir

    return os.path.join(statedir.state_dir(), SOCKET_NAME)


def main() -> int:
    words = sys.argv[1:]
    if words and words[0] in SERVED and os.environ.get("STOCKADE_NO_SERVER") != "1":
        status = _through_server(words)
        if status is not None:
            return status
    from stockade.cli import console_main

    return console_main()


def caller_context() -> bytes:
    """What a served run must share with the process that asks for it, for it to be the run
    that process would have made itself: its namespaces and root, the confinement of its
    credentials (capabilities, no_new_privs, seccomp, its LSM label), its supplementary groups
    and its resource limits. The CLI server serves only a caller whose context is its own
    (the cgroup is the one difference it allows: see SECURITY.md). OSError without /proc."""
    root = os.stat("/")
    status = _text("/proc/self/status").splitlines()
    parts = [*(os.readlink(f"/proc/self/ns/{name}") if os.path.exists(f"/proc/self/ns/{name}")
               else "-" for name in _NAMESPACES),
             f"root {root.st_dev} {root.st_ino}", repr(sorted(os.getgroups())),
             _text("/proc/self/limits"),
             *(line for line in status if line.partition(":")[0] in _CONFINEMENT),
             _text("/proc/self/attr/current", missing="-")]
    return "\n".join(parts).encode().replace(b"\0", b"\\0")


def _text(path: str, missing: str | None = None) -> str:
    """The file's text; `missing` if it cannot be read and that is not None (an LSM
    attribute reads as EINVAL where no LSM keeps one)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        if missing is None:
            raise
        return missing


def encode_request(argv: list[str], cwd: str, umask: int, context: bytes,
                   env: dict[bytes, bytes]) -> bytes:
    """A 4-byte length, then NUL-terminated fields: the number of argv words, the words, the
    working directory, the umask (octal), the caller's context (`caller_context`), then
    `NAME=VALUE` per variable (none of them can contain a NUL)."""
    fields = [str(len(argv)).encode(), *map(os.fsencode, argv), os.fsencode(cwd),
              f"{umask:o}".encode(), context,
              *(name + b"=" + value for name, value in env.items())]
    body = b"".join(field + b"\0" for field in fields)
    return struct.pack("<I", len(body)) + body


def _through_server(words: list[str]) -> int | None:
    """The command's exit status from the CLI server; None when none answers (nothing ran)."""
    try:
        path = socket_path()
        cwd = os.getcwd()
    except (OSError, RuntimeError):  # no working directory, or no home: run here
        return None
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            conn.connect(path)
            context = caller_context()
        except OSError:  # no server answers, or no /proc: run here
            return None
        umask = os.umask(0o077)
        os.umask(umask)
        message = encode_request(words, cwd, umask, context, os.environb)
        try:
            sent = conn.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                             struct.pack("3i", 0, 1, 2))])
        except OSError:
            return None  # e.g. a standard stream is closed: run here instead
        if sent < len(message):  # (a send of nothing fails once the server has answered)
            try:
                conn.sendall(message[sent:])
            except OSError:
                return None  # it went before it had the whole request: nothing ran
        answer = b""
        try:
            while not answer.endswith(b"\n") and (chunk := conn.recv(16)):
                answer += chunk
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED  # closing the connection ends the command's sandbox
        except OSError:
            answer = b""
        if answer == NOT_SERVED:
            return None  # it ran nothing: this process's context is not the server's
        if not answer.strip().isdigit():
            print("stockade: cli_server_lost: the CLI server ended without an exit status",
                  file=sys.stderr)
            return EXIT_SETUP
        return int(answer)
    finally:
        conn.close()
