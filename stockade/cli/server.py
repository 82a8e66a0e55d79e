"""The CLI server: `stockade run`, `sandbox-exec` and `exec` without an interpreter's worth of
imports.

`stockade daemon` starts it (before any thread) on `cli.sock` in the state directory. It is a
single-threaded process that has imported the whole command line and attested the host once;
for each request it forks a child, which takes the client's working directory, environment
and standard streams (passed as descriptors) and runs the ordinary command line, `main`,
exactly as the `stockade` program would have — so the flags, the output, the errors and the
exit status are the same. The client (stockade/program.py) only connects, sends, and waits for
the exit status.

Each spare child's sandbox skeleton is prepared for the view frame (linux/frame.py) of the
last request that launched, as the zygote prepares its spares, and is used only under the same
rule: the same view, and a survey of the host made for this request with the same identity.

One request: argv, working directory, umask and environment (`encode_request` in
stockade/cliwire.py) of at most MAX_REQUEST bytes, the client's stdin, stdout and stderr
attached to its first byte (SCM_RIGHTS). The answer is the exit status as one line. The
client is known by what the kernel says of it, never by what it sends: only a peer whose
context (stockade/linux/peer.py: user, namespaces, root, capabilities, no_new_privs, seccomp,
LSM label, supplementary groups, resource limits), read by the server from the peer's own
`/proc` through its pidfd, is the server's own is served — no process inside a sandbox ever
is — and only for the command lines in SERVED, checked here; any other request is answered
NOT_SERVED before anything runs (a client then runs the command line itself). The child ends
the moment the client's connection closes (SIGIO), and its sandbox with it, as a command line
killed by SIGKILL would; the client's first Ctrl-C is passed on (CANCEL) and taken as one here.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import os
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

from stockade.cli.common import CommandLine
from stockade.cliwire import CANCEL, CANCEL_IF_TAKEN, FACTS, NOT_SERVED, SERVED, socket_path
from stockade.errors import StockadeError
from stockade.linux import peer, servercheck
from stockade.linux.fdpass import close_all, recv_fds
from stockade.linux.privilege import close_fds
from stockade.linux.syscalls import prctl
from stockade.linux.zygote import ForkSpawner, fork_directly

MAX_REQUEST = 1 << 20  # bytes of argv, cwd and environment
EXIT_LOST = 130  # the client went away: as if interrupted
PR_SET_PDEATHSIG = 1
SPARE_RETRY = 0.5  # seconds before forking another spare after one died unused
IDLE = b"I"  # a spare's word to the server: no request came for the idle time; the socket is gone
_HEADER = struct.Struct("<I")


@dataclass(frozen=True)
class Program:
    """The client program's facts (stockade.cliwire.program_facts)."""

    executable: str
    prefix: str
    base_prefix: str
    package: str
    flags: str  # isolated, ignore_environment, no_user_site, no_site, safe_path: "0"/"1" each
    argv0: str
    started_in: str
    pycache_prefix: str
    user_site: str
    orig_argv: list[str]
    path: list[str]
    modules: list[str]  # the files (or origins) of what it imported
    finders: list[str]  # its meta-path finders and path hooks, by class
    searched: list[str]  # sys.path_importer_cache's keys

    def imports_as(self, own: Imports) -> bool:
        """Whether its imports are this process's (`own`): the same interpreter as named,
        prefixes, Stockade package, import flags (safe_path aside: the server starts with
        -P), bytecode cache prefix and user site, and nothing imported nor any finder that
        this process has not — so that the host code judged here holds all of its own."""
        return (self.kind() == own.facts and own.modules.issuperset(self.modules)
                and own.finders.issuperset(self.finders))

    def kind(self) -> tuple[str, ...]:
        """What two programs that import alike share (safe_path aside)."""
        return (self.executable, self.prefix, self.base_prefix, self.package, self.flags[:4],
                self.pycache_prefix, self.user_site)

    def become(self) -> None:
        """Make this process's host code, as stockade/launch/hostcode.py reads it, the
        client's: how it was started, its script, its import path, where it started, what
        its imports searched."""
        import stockade
        from stockade.launch import hostcode

        sys.orig_argv = list(self.orig_argv)
        sys.argv = [self.argv0]
        sys.path[:] = self.path
        stockade._started_in = self.started_in or None
        hostcode.client_safe_path = self.flags[4:] == "1"
        for key in self.searched:
            sys.path_importer_cache.setdefault(key, None)


@dataclass(frozen=True)
class Imports:
    """What this process's imports are, for `Program.imports_as`."""

    facts: tuple[str, ...]
    modules: frozenset[str]
    finders: frozenset[str]

    @classmethod
    def here(cls) -> Imports:
        from stockade.cliwire import program_parts

        fixed, lists = program_parts()
        return cls(Program(*fixed, *lists).kind(), frozenset(lists[2]), frozenset(lists[3]))


@dataclass(frozen=True)
class Request:
    argv: list[str]
    cwd: str
    umask: int
    env: dict[bytes, bytes]
    program: Program | None = None  # None: a client that sent no facts (it is not served)


def start(command_line: CommandLine) -> int | None:
    """Fork the server of `command_line` from a single-threaded process (the daemon, before its
    threads); its pid, or None when another server (of this user's own context) already
    answers on the socket; one that is not is replaced (`_bind`). It ends with its parent."""
    path = socket_path()
    with contextlib.suppress(servercheck.ServerUntrusted):
        if servercheck.answers(path):
            return None
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() == parent:  # (else it died before the signal was set: end now)
                close_fds({0, 1, 2})  # e.g. the daemon's own listener
                serve(path, command_line)
        finally:
            os._exit(70)
    return pid


def stop(pid: int) -> None:
    """End the server `start` forked (our unreaped child: its pid cannot have been reused)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path())


def serve(path: str, command_line: CommandLine, *, check_peers: bool = True,
          idle: float | None = None, context: tuple[str, ...] = peer.RUN_CONTEXT) -> None:
    """Attest the host, listen on `path`, and keep one spare child waiting for the next
    request, which it runs with `command_line`. Returns only when `idle` seconds passed with
    no request (the socket is then gone; runs still being served go on). `context`: the parts
    of RUN_CONTEXT a client must share besides (peer.py). `check_peers` False (tests only,
    never set by the command line: it proves the evidence row that attacks the server can
    fail) serves a peer in any context."""
    from stockade.cli import run as cli_run
    from stockade.launch.compile import CompileContext, compile_policy
    from stockade.launch.manager import SandboxManager
    from stockade.linux import init, launcher  # noqa: F401 - imported before any fork
    from stockade.policy import preset

    cli_run.fork_directly = True
    fork_directly()
    # Attested once here rather than by every child; a host where the sandbox cannot be made
    # is still served: each child then gives its client the same refusal it would have had.
    with contextlib.suppress(StockadeError):
        SandboxManager().select(compile_policy(preset("read-only"), ["true"],
                                               CompileContext.current("/")))
    for name in SERVED:  # cached: every child finds the parser of its command built
        command_line.build_parser(name)
    gc.freeze()  # the collector leaves these objects alone: fewer copy-on-write faults per child
    listener = _bind(path)
    bound = os.stat(path)
    waiting = _Waiting(path, (bound.st_dev, bound.st_ino), idle, context, _installed())
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    last_view: bytes | None = None  # the view frame of the last request that launched
    telling: dict[int, bytearray] = {}  # serving children's pipes -> what they said so far
    server = os.getpid()
    while True:
        taken_r, taken_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            for fd in (taken_r, *telling):
                os.close(fd)
            _spare(listener, taken_w, command_line.main, fork_directly(), last_view,
                   check_peers, server, waiting)
        os.close(taken_w)
        while True:  # until the spare takes a request; meanwhile, hear the views
            readable = select.select([taken_r, *telling], [], [])[0]
            for fd in readable:
                if fd != taken_r:
                    last_view = _hear(fd, telling) or last_view
            if taken_r in readable:
                break
        said = os.read(taken_r, 1)
        if said == IDLE:
            return  # (the spare took the socket away first: no client can be left waiting)
        if said:
            telling[taken_r] = bytearray()  # it goes on to say its view, then closes
        else:
            os.close(taken_r)  # the spare died before taking a request
            time.sleep(SPARE_RETRY)


def _hear(fd: int, telling: dict[int, bytearray]) -> bytes | None:
    """Read what a serving child says on its pipe: once it closes, the view frame it launched
    with (the next spare is prepared for it), if it said one."""
    chunk = os.read(fd, 65536)
    if chunk:
        telling[fd] += chunk
        return None
    said = telling.pop(fd)
    os.close(fd)
    return bytes(said[1:]) if said[:1] == b"V" else None


@dataclass(frozen=True)
class _Waiting:
    """How a spare waits: at `path` (the socket file `bound`, device and inode), for at most
    `idle` seconds (None: for ever), serving clients that share `context` with it, while
    Stockade's code on disk is still what this server runs (`installed`)."""

    path: str
    bound: tuple[int, int]
    idle: float | None
    context: tuple[str, ...]
    installed: tuple[tuple[str, int, int, int], ...]  # `_installed()` when the server began


def _spare(listener: socket.socket, taken_w: int, main: object,
           spawner: ForkSpawner, view: bytes | None, check_peers: bool,
           server: int, waiting: _Waiting) -> NoReturn:
    """A child waiting for one request, with its sandbox's skeleton already made (namespaces
    entered, pid 1 waiting; with the last request's view, its mounts built and its command
    process confined too): it accepts, tells the server to fork the next spare, serves, and
    tells the server the view it launched with. After `waiting.idle` seconds with no request
    it ends the server instead (`_close_idle`)."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # while idle, it ends with the server
        if os.getppid() != server:  # it died before the signal was set: no one would end us
            os._exit(70)
        with contextlib.suppress(Exception):
            spawner.prepare(view)  # if this fails, the launch makes one and reports why
        own = peer.own_context(waiting.context)  # (read while waiting, not on a request's time)
        imports = Imports.here()
        deadline = None if waiting.idle is None else time.monotonic() + waiting.idle
        while True:
            if deadline is not None and not select.select(
                    [listener], [], [], max(0.0, deadline - time.monotonic()))[0]:
                _close_idle(listener, waiting, taken_w)
            conn, _ = listener.accept()
            accepted = peer.boottime()
            try:
                if check_peers:
                    peer.check_peer(conn, own, accepted=accepted)
            except (OSError, peer.PeerRefused):
                # Its run would not be the one it would have made itself (another user,
                # namespace, root, confinement, groups or limits), or it cannot be shown to
                # be: nothing runs here. (A process inside a sandbox always lands here.)
                _turn_away(conn)
                continue
            try:
                request, fds = _read(conn)
            except OSError:
                conn.close()  # not a request: go on waiting
                continue
            except ValueError:  # (one it cannot read is run there, not lost: attack B9)
                _turn_away(conn)
                continue
            if _changed(waiting.installed):  # (the code here is not the code there)
                close_all(fds)
                _turn_away(conn)
                _close_idle(listener, waiting, taken_w)
            # (another interpreter, venv or install runs the command line itself; so does
            # --ask, which asks at the client's terminal, which this process has not)
            if (request.argv[0] in SERVED and "--ask" not in request.argv
                    and request.program is not None and request.program.imports_as(imports)):
                break
            close_all(fds)
            _turn_away(conn)
        prctl(PR_SET_PDEATHSIG, 0)  # now it belongs to its client
        os.write(taken_w, b"T")
        spawner.on_view = functools.partial(_say_view, taken_w)
        listener.close()
    except BaseException:  # noqa: BLE001 - the server forks another
        os._exit(70)
    _child(conn, fds, request, main)


def _installed() -> tuple[tuple[str, int, int, int], ...]:
    """Each file of a Stockade module this process imported, with its inode, size and change
    time: an upgrade or checkout changes some (attack B12), and the server then ends rather
    than run its old code for a client of the new."""
    import stockade

    package = os.path.dirname(stockade.__file__) + os.sep
    return tuple(sorted(_stat(path) for module in list(sys.modules.values())
                        if isinstance(path := getattr(module, "__file__", None), str)
                        and path.startswith(package)))


def _changed(installed: tuple[tuple[str, int, int, int], ...]) -> bool:
    return any(_stat(was[0]) != was for was in installed)


def _stat(path: str) -> tuple[str, int, int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (path, 0, 0, 0)
    return (path, info.st_ino, info.st_size, info.st_ctime_ns)


def _close_idle(listener: socket.socket, waiting: _Waiting, taken_w: int) -> NoReturn:
    """Take the socket away (if it is still this server's), turn away whoever connected
    before it went — they run the command line themselves — and tell the server to end."""
    with contextlib.suppress(OSError):
        found = os.stat(waiting.path)
        if (found.st_dev, found.st_ino) == waiting.bound:
            os.unlink(waiting.path)
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # (BlockingIOError: no one else is waiting, and no one can come)
            break
        _turn_away(conn)
    os.write(taken_w, IDLE)
    os._exit(0)


def _turn_away(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(NOT_SERVED)
    conn.close()


def _say_view(taken_w: int, view: bytes) -> None:
    """Tell the server this request's view frame (at launch; nothing of the request's own)."""
    said = memoryview(b"V" + view)
    with contextlib.suppress(OSError):
        while said:
            said = said[os.write(taken_w, said):]
    os.close(taken_w)


def _bind(path: str) -> socket.socket:
    from stockade.lifecycle import statedir

    statedir.ensure(os.path.dirname(path))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead server's, or a planted one (`start` found no server of ours)
    listener = statedir.bind_socket(path)
    listener.listen(64)
    return listener


def _read(conn: socket.socket) -> tuple[Request, list[int]]:
    """The request and its three descriptors; ValueError for anything else."""
    conn.settimeout(5.0)
    header, fds = recv_fds(conn, 3)
    try:
        if len(fds) != 3 or len(header) < _HEADER.size:
            raise ValueError("no request")
        (size,) = _HEADER.unpack(header[:_HEADER.size])
        if size > MAX_REQUEST:
            raise ValueError("too large")
        body = bytearray(header[_HEADER.size:])
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("truncated")
            body += chunk
        request = decode_request(bytes(body))
    except BaseException:
        close_all(fds)
        raise
    conn.settimeout(None)
    return request, fds


def decode_request(body: bytes) -> Request:
    """The inverse of stockade.cliwire.encode_request (ValueError if it is not one)."""
    if len(body) > MAX_REQUEST or not body.endswith(b"\0"):
        raise ValueError("not a request")
    fields = body[:-1].split(b"\0")
    count = int(fields[0]) if fields[0].isdigit() else -1
    if not 0 < count <= len(fields) - 3:
        raise ValueError("not a request")
    words = [os.fsdecode(word) for word in fields[1:count + 1]]
    cwd, umask = os.fsdecode(fields[count + 1]), fields[count + 2]
    program, argv = _program(words)
    if not (umask and len(umask) <= 3 and set(umask) <= set(b"01234567")):
        raise ValueError("not a umask")
    env = {}
    for pair in fields[count + 3:]:
        name, equals, value = pair.partition(b"=")
        if not name or not equals:
            raise ValueError("not a variable")
        env[name] = value
    if not argv:
        raise ValueError("no command line")
    return Request(argv, cwd, int(umask, 8), env, program)


def _program(words: list[str]) -> tuple[Program | None, list[str]]:
    """The client's Program and its argv, from a request's words (ValueError if malformed)."""
    if not words or words[0] != FACTS:
        return None, words
    fixed, rest = words[1:10], iter(words[10:])
    if len(fixed) != 9:
        raise ValueError("no program facts")

    def counted() -> list[str]:
        size = next(rest, "")
        if not size.isdigit() or int(size) > len(words):
            raise ValueError("not a count")
        listed = [next(rest, None) for _ in range(int(size))]
        if None in listed:
            raise ValueError("truncated facts")
        return listed  # type: ignore[return-value]

    lists = [counted() for _ in range(5)]  # orig_argv, path, modules, finders, searched
    return Program(*fixed, *lists), list(rest)


def _child(conn: socket.socket, fds: list[int], request: Request, main: object) -> NoReturn:
    """Become the client's command line (one of SERVED), then report its exit status."""
    code = 70
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _end_with_client(conn)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        close_all(fds)
        os.environb.clear()
        os.environb.update(request.env)
        os.umask(request.umask)  # what each launch hands its command (see linux/frame.py)
        if request.program is not None:  # (always: `_spare` serves no other)
            request.program.become()
        try:
            os.chdir(request.cwd)
        except OSError as exc:
            print(f"stockade: usage: cannot enter {request.cwd!r} ({exc.strerror})",
                  file=sys.stderr)
            code = 2
        else:
            code = main(request.argv, only=SERVED)  # type: ignore[operator]
    except KeyboardInterrupt:  # (the client's Ctrl-C, before the command line could take it)
        code = EXIT_LOST
    except BaseException:  # noqa: BLE001 - the client gets a status, never a hang
        print("stockade: cli_server_failed: the command line failed in the CLI server",
              file=sys.stderr)
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            conn.sendall(f"{code}\n".encode())
        os._exit(code)


def _end_with_client(conn: socket.socket) -> None:
    """Exit (and so end the sandbox, whose lifeline this process holds) as soon as the client's
    end closes: the socket signals SIGIO when it turns readable. What the client may send
    more is CANCEL, Ctrl-C pressed there: here it is SIGINT, which the command line takes as
    its own Ctrl-C (whatever the server's disposition of SIGINT was). CANCEL_IF_TAKEN is one
    that the client inherited ignored: SIGINT here only while the command line has a handler
    of its own (run --json's), which overrides that; otherwise ignored, as it was there."""

    def readable(*_: object) -> None:
        try:
            sent = conn.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            os._exit(EXIT_LOST)
        if sent not in (CANCEL, CANCEL_IF_TAKEN):
            os._exit(EXIT_LOST)
        if sent == CANCEL or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGIO, readable)
    fcntl.fcntl(conn.fileno(), fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(conn.fileno(), fcntl.F_SETFL, fcntl.fcntl(conn.fileno(), fcntl.F_GETFL)
                | os.O_ASYNC)
    if select.select([conn], [], [], 0)[0]:  # it closed before the signal was armed
        os._exit(EXIT_LOST)
