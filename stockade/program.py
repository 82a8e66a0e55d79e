"""The `stockade` program (bin/stockade, installed as the `stockade` command, and
`python -m stockade`).

`stockade run`, `sandbox-exec` and `exec` go to the CLI server when one listens in the state
directory (stockade/cli/server.py; the wire is stockade/cliwire.py): this process then imports
almost nothing, passes its argv, working directory, environment and standard streams, and
exits with the status the server reports. Everything else, and every run when no server
answers (or where there can be none: any system but Linux), is the ordinary command line in
this process (stockade/cli). A run that found no server listening starts one when it is done
(stockade/cli/autoserver.py: it ends after `STOCKADE_SERVER_IDLE` seconds unused; "0" starts
none); `stockade daemon` runs one too.

Nothing is sent before the server is known for what it is: a sandbox may have planted a socket
where the state directory is expected (stockade/linux/servercheck.py checks the directory and,
through the kernel, the process that listens). A server that fails that check is not used: the
command line runs here, and says so on stderr (`server_untrusted`, naming the socket).
"""

from __future__ import annotations

# _socket is the C module, not socket.py: the wrapper's own imports (enum, selectors) would
# cost about as much as the rest of this program's start.
import _signal
import _socket
import os
import struct
import sys

from stockade.cliwire import (
    CANCEL,
    CANCEL_IF_TAKEN,
    NOT_SERVED,
    SERVED,
    SOCKET_NAME,
    encode_request,
    program_facts,
    socket_path,
)
from stockade.errors import UsageError

__all__ = ["NOT_SERVED", "SERVED", "SOCKET_NAME", "encode_request", "main", "socket_path"]

EXIT_SETUP = 70
EXIT_INTERRUPTED = 130
ABSENT = -1  # _through_server: no server listens (statuses are 0-255); one is then started


def main(*, check_server: bool = True) -> int:
    """`check_server` False (tests only, never set by the program: it proves the evidence row
    that plants a server can fail) talks to whatever listens on the socket."""
    words = sys.argv[1:]
    absent = False
    if words and words[0] in SERVED and os.environ.get("STOCKADE_NO_SERVER") != "1":
        status = _through_server(words, check_server=check_server)
        if status is not None and status != ABSENT:
            return status
        absent = status == ABSENT
    from stockade.cli import console_main, run

    status = _exit_word(console_main())
    if absent and run.launched:
        from stockade.cli import autoserver

        autoserver.start_in_background()
    return status


def _exit_word(status: int) -> int:
    """`status` in the form sys.exit passes on whole. A Windows exit code is an unsigned 32-bit
    word (a crash's NTSTATUS, 0xC0000005, is one), but CPython before 3.12.8 and 3.13.1 reads
    sys.exit's int as a C long, 32 bits on Windows, and exits 0xFFFFFFFF for one that does not
    fit; the same 32 bits as a negative number reach ExitProcess unchanged (and elsewhere the
    low byte, which is all a POSIX status keeps, is the same)."""
    return status - (1 << 32) if status >= 1 << 31 else status


def _through_server(words: list[str], *, check_server: bool = True) -> int | None:
    """The command's exit status from the CLI server; ABSENT when none listens, None when the
    one that answers is not to be trusted or does not serve this process (nothing ran)."""
    if not sys.platform.startswith("linux"):  # (the CLI server is Linux's alone)
        return None
    try:
        path = socket_path()
        cwd = os.getcwd()
    except (OSError, RuntimeError, UsageError):  # no working directory, no home, or a
        return None  # mistaken STOCKADE_STATE_DIR: run here (which says so)
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        from stockade.linux.servercheck import ServerUntrusted, connect

        try:
            if check_server:
                connect(conn, path)
            else:
                conn.connect(path)
        except OSError:  # no server answers: run here
            return ABSENT
        except ServerUntrusted as exc:
            print(f"stockade: server_untrusted: not using {path} ({exc.why}): nothing was "
                  "sent to it; the command runs here", file=sys.stderr)
            return None
        umask = os.umask(0o077)
        os.umask(umask)
        message = encode_request(words, cwd, umask, os.environb, program_facts())
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
        # A client that inherited SIGINT ignored (a script's background job) passes each on
        # as CANCEL_IF_TAKEN, from the handler (no KeyboardInterrupt: it never leaves for one),
        # for the command line there to ignore, as it would here, unless it takes SIGINT
        # itself (`run --json` does).
        ignoring = _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN
        if ignoring:
            _signal.signal(_signal.SIGINT, lambda *_: _pass_on(conn))
        try:
            answer = _answer(conn)
        finally:
            if ignoring:  # (NOT_SERVED: the command line runs here, as it was started)
                _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        if answer is None:
            return EXIT_INTERRUPTED  # closing the connection ends the command's sandbox
        if answer == NOT_SERVED:
            return None  # it ran nothing: this process's context is not the server's own
        if not answer.strip().isdigit():
            print("stockade: cli_server_lost: the CLI server ended without an exit status",
                  file=sys.stderr)
            return EXIT_SETUP
        return int(answer)
    finally:
        conn.close()


def _answer(conn: _socket.socket) -> bytes | None:
    """The server's answer (b"" if it went without one); None on a second Ctrl-C. The first
    is passed on (CANCEL), for the command line there to take as Ctrl-C, as it would here:
    `run --json` then prints its result, cancelled."""
    answer, interrupted = b"", False
    while not answer.endswith(b"\n"):
        try:
            chunk = conn.recv(16)
        except KeyboardInterrupt:
            if interrupted:
                return None
            interrupted = True
            try:
                conn.send(CANCEL)
            except OSError:
                return None
            continue
        except OSError:
            return b""
        if not chunk:
            break
        answer += chunk
    return answer


def _pass_on(conn: _socket.socket) -> None:
    try:
        conn.send(CANCEL_IF_TAKEN)
    except OSError:  # the server went: its answer (or none) ends the wait
        pass
