"""`stockade serve --agent-sandbox`: the in-pod runtime of kubernetes-sigs/agent-sandbox, on
the standard library's HTTP server, every command and file operation in a warm Stockade
sandbox (a Workspace).

It speaks the contract of agent-sandbox's python-runtime example, which its Python SDK
(`k8s-agent-sandbox`) calls when a connection is not sandboxd's:

    GET  /                  {"status": "ok", "message", "executing", "max_concurrent"}
    POST /execute           {"command": STR, "timeout_seconds": N?}
                            -> {"stdout", "stderr", "exit_code", "timed_out", "denials"}
    POST /upload            multipart/form-data, one part "file" whose filename is the path
    GET  /download/{path}   the file's bytes
    GET  /list/{path}       [{"name", "size", "type", "mod_time", "kind"}]
    GET  /exists/{path}     {"path", "exists"}

As there, a path is relative to the workspace (leading slashes are dropped), and a command is
a shell string (run by /bin/sh -c inside the sandbox, as the SDK's sandboxd path also does).
What Stockade adds: the policy is fixed when the server starts and no request can widen it (a
`timeout_seconds` only shortens `limits.timeout`); file operations are the Workspace's, so a
path never leaves the workspace and no link is followed; every refusal is typed, a JSON body
{"error": CODE, "message", "grant"}, and what the sandbox stopped or cut comes back as
`denials`, each with the policy grant that would allow it (and in words at the end of
`stderr`, for a model that reads only the output). Request bodies are bounded
(MAX_COMMAND_BYTES; an upload by `max_upload`, also what a download may return) and framed
strictly; what a web browser sends is refused (see _from_no_browser).

Fairness (a pod's readiness probe and its file API must answer while its agent's commands
hang): at most `max_concurrent` commands run at once, each in a sandbox of its own; one more
is refused at once, 503 `busy` with Retry-After, not queued. Health never touches a sandbox,
and file operations run in sandboxes of their own (FILE_SANDBOXES), never behind a command. A
client that ends its connection while its command runs has its command's tree killed: nobody
is left to read the answer, and the slot is free again at once. What a client sends while its
command runs is dropped and its connection ends with the answer (no pipelining past /execute):
its EOF is still seen. Connections are bounded in number (`max_connections`, below the
descriptor limit; one more is 503 `busy` and closed) and each request head in bytes
(MAX_HEAD) and time (HEAD_SECONDS, however slowly sent)."""

from __future__ import annotations

import contextlib
import email.errors
import email.message
import errno
import http.client
import ipaddress
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

from stockade.errors import StockadeError, UsageError
from stockade.integrations.workspace import FileError, Workspace
from stockade.launch.denials import with_denials
from stockade.policy import Policy

MAX_COMMAND_BYTES = 1 << 20  # an /execute body
DEFAULT_MAX_UPLOAD = 64 << 20  # an /upload body, and the largest file /download returns
DEFAULT_MAX_CONCURRENT = 8  # commands running at once (--max-concurrent)
FILE_SANDBOXES = 2  # sandboxes of the file operations' own (short: they may wait for each other)
RETRY_AFTER = 1  # seconds a refused /execute is told to wait (Retry-After)
HANGUP_POLL = 0.1  # seconds between looks at a running command's connection
HANGUP_EXTRA = 64 << 10  # bytes a client may send while its command runs (dropped)
IDLE_SECONDS = 60  # a connection that sends nothing for this long is closed
HEAD_SECONDS = 60  # a request's line and headers arrive whole within this, however slowly
MAX_HEAD = 64 << 10  # bytes of a request's line and headers together (else 431)
DEFAULT_MAX_CONNECTIONS = 256  # connections open at once (--max-connections), past: 503
FD_RESERVE = 256  # descriptors kept from connections for the sandboxes and the server
ACCEPT_BACKOFF = 0.1  # seconds the server waits when accept fails for want of descriptors
DRAIN_BYTES = 1 << 30  # how much of a refused body is read and dropped so its 413 is heard
MAX_PARTS = 16  # multipart parts an upload may have up to its "file" one
MAX_PART_HEAD = 8 << 10  # bytes of one part's headers
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")  # (no sign, 0x, _ or space: int() takes those)
_LENGTH = re.compile(r"[0-9]{1,18}")

# A FileError's code as an HTTP status (the body carries the code itself; one not here is
# 400). No refusal is a 5xx (the SDK retries a GET's) but /execute's `busy` 503, which asks
# for a retry.
_STATUS = {"outside_workspace": 403, "symlink_refused": 403, "permission_denied": 403,
           "not_found": 404, "not_a_directory": 404, "is_a_directory": 409,
           "not_a_regular_file": 409, "exists": 409, "too_large": 413, "no_space": 507,
           "usage": 400, "name_too_long": 400}
MAX_ARGUMENT = 128 << 10  # the kernel's bound on one argument (MAX_ARG_STRLEN): sh -c's command


class Refusal(Exception):
    """A request answered with a typed error: HTTP `status`, body {error, message, grant}."""

    def __init__(self, status: int, code: str, message: str, grant: str | None = None, *,
                 retry_after: int | None = None) -> None:
        super().__init__(code, message)
        self.status, self.code, self.message, self.grant = status, code, message, grant
        self.retry_after = retry_after


def loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (this pod)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # (a name that may resolve anywhere)


class AgentSandboxServer(ThreadingHTTPServer):
    """The HTTP server around two Workspaces over one directory and policy, `commands` (one
    sandbox per command slot) and `files` (closed with it)."""

    daemon_threads = True

    def __init__(self, commands: Workspace, files: Workspace, host: str, port: int, *,
                 max_upload: int = DEFAULT_MAX_UPLOAD, allow_remote: bool = False,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.commands, self.files, self.max_upload = commands, files, max_upload
        self.max_concurrent, self.executing = max_concurrent, 0
        self._executing = threading.Lock()
        # Connections past the descriptors left would make accept fail EMFILE, and sandboxes
        # fail to start: the cap stays below RLIMIT_NOFILE, FD_RESERVE kept
        soft = _descriptor_limit()
        self.max_connections = max_connections if soft is None else max(
            1, min(max_connections, soft - FD_RESERVE))
        self.connections = 0
        self.heads: dict[socket.socket, float] = {}  # a connection reading a head: its deadline
        self._connections = threading.Lock()
        super().__init__((host, port), Handler)
        threading.Thread(target=self._reap, daemon=True).start()
        # The Host a request may name (None: any, behind --allow-remote): a page rebinding
        # its own name to 127.0.0.1 names itself
        bound = self.server_address[1]
        self.hosts = None if allow_remote else {
            f"{name}:{bound}" for name in (f"[{host}]" if ":" in host else host, "localhost",
                                           "127.0.0.1", "[::1]")}

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(ACCEPT_BACKOFF)  # (else the listening socket, still ready, spins)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, or past `max_connections` 503 `busy` at once and the
        connection closed (health is answered again once connections end)."""
        with self._connections:
            refused = self.connections >= self.max_connections
            self.connections += not refused
        if not refused:
            super().process_request(request, client_address)
            return
        body = json.dumps({"error": "busy", "message": f"all {self.max_connections} "
                           "connections are open (the server's --max-connections); retry "
                           f"after {RETRY_AFTER} s", "grant": None}).encode()
        with contextlib.suppress(OSError):
            request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                         b"\r\nRetry-After: %d\r\nConnection: close\r\nContent-Length: %d"
                         b"\r\n\r\n%s" % (RETRY_AFTER, len(body), body), socket.MSG_DONTWAIT)
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections:
                self.connections -= 1
                self.heads.pop(request, None)

    def _reap(self) -> None:
        """End each connection whose request head is not whole by its deadline: the idle
        timeout is per read, and a byte every few seconds would hold it for ever."""
        while True:
            time.sleep(1)
            now = time.monotonic()
            with self._connections:
                late = [connection for connection, deadline in self.heads.items()
                        if deadline < now]
            for connection in late:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)  # (its blocked read ends)

    def server_close(self) -> None:
        super().server_close()
        self.commands.close()
        self.files.close()

    @contextlib.contextmanager
    def command_slot(self) -> Iterator[None]:
        """One of the `max_concurrent` command slots for one /execute, or 503 `busy` at once:
        a queue of commands waiting for slots would grow without bound behind hung ones."""
        with self._executing:
            if self.executing >= self.max_concurrent:
                raise Refusal(503, "busy", f"all {self.max_concurrent} command slots are "
                              "running commands (the server's --max-concurrent); retry "
                              f"after {RETRY_AFTER} s, or serve with a larger --max-concurrent",
                              retry_after=RETRY_AFTER)
            self.executing += 1
        try:
            yield
        finally:
            with self._executing:
                self.executing -= 1


class Handler(BaseHTTPRequestHandler):
    """One connection: each request answered as the contract says, or typed refusal."""

    server: AgentSandboxServer
    server_version = "stockade-agent-sandbox"
    protocol_version = "HTTP/1.1"  # (keep-alive: the SDK pools its connections)
    timeout = IDLE_SECONDS
    disable_nagle_algorithm = True  # (headers and body are two writes: no 40 ms delayed ACK)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post)

    def setup(self) -> None:
        super().setup()
        self.rfile = _Head(self.rfile)

    def handle_one_request(self) -> None:
        self.rfile.left = MAX_HEAD
        with self.server._connections:
            self.server.heads[self.connection] = time.monotonic() + HEAD_SECONDS
        super().handle_one_request()

    def parse_request(self) -> bool:
        """http.server's reading of the request line and headers, then a head it read
        leniently refused 400 (RFC 9112 5.1): a line without a colon or with whitespace
        before it ends its headers there (what follows, an Origin say, unseen, and a
        `Content-Length : N` a proxy in front frames by ignored: a request smuggled), and an
        obsolete line folding is read otherwise by others."""
        parsed = super().parse_request()
        with self.server._connections:
            self.server.heads.pop(self.connection, None)  # (the head is read: no deadline)
        self.rfile.left = None
        if not parsed:
            return False
        if any(isinstance(defect, email.errors.MissingHeaderBodySeparatorDefect)
               for defect in self.headers.defects) \
                or any("\n" in value for value in self.headers.values()):
            self.close_connection = True  # (where this request ends is not known)
            self._send(Refusal(400, "usage", "a malformed request: a header line without a "
                               "colon, with whitespace before it, or folded"))
            return False
        return True

    def _answer(self, route: Any) -> None:
        try:
            self._from_no_browser()
            self._send(route(urllib.parse.urlsplit(self.path).path))
        except Refusal as refusal:
            self._send(refusal)

    def _send(self, answer: tuple[int, bytes, str] | Refusal) -> None:
        """Write `answer`, a route's (status, body, Content-Type) or a typed refusal."""
        retry_after = None
        if isinstance(answer, Refusal):
            status, kind, retry_after = answer.status, "application/json", answer.retry_after
            body = json.dumps({"error": answer.code, "message": answer.message,
                               "grant": answer.grant}).encode()
        else:
            status, body, kind = answer
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if retry_after is not None:
                self.send_header("Retry-After", str(retry_after))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # (a client gone before its answer)

    def _from_no_browser(self) -> None:
        """Refuse what a web page can send here: a browser always says its Origin (the SDK
        never does), a page that rebinds its name to this address still names itself as
        Host, and a page's POST without a CORS preflight cannot be application/json."""
        if self.headers.get("Origin") is not None:
            self.close_connection = True  # (its body, if any, is not read)
            raise Refusal(403, "cross_origin", "a request with an Origin header (a web "
                          "browser's) is refused: the server has no authentication")
        host = (self.headers.get("Host") or "").lower()
        if self.server.hosts is not None and host not in self.server.hosts:
            self.close_connection = True
            raise Refusal(403, "foreign_host", f"Host {host!r} is not this loopback server's "
                          "address (a name rebound to it?); serving other names needs "
                          "--allow-remote")
        kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if self.command == "POST" and urllib.parse.urlsplit(self.path).path == "/execute" \
                and kind != "application/json":
            self.close_connection = True
            raise Refusal(403, "not_json", "/execute takes Content-Type application/json only")

    def _get(self, path: str) -> tuple[int, bytes, str]:
        workspace = self.server.files
        if self._framing() != (False, 0):  # (left unread, it would be read as a request)
            self._malformed("a GET with a body")
        if path == "/":  # (no sandbox: it answers however busy the commands keep them)
            return _json({"status": "ok", "message": "Sandbox Runtime is active.",
                          "runtime": "stockade", "executing": self.server.executing,
                          "max_concurrent": self.server.max_concurrent})
        action, _, rest = path.lstrip("/").partition("/")
        target = _relative(urllib.parse.unquote(rest))
        if action == "download":
            data = _file(lambda: workspace.read_file(target, limit=self.server.max_upload))
            return 200, data, "application/octet-stream"
        if action == "list":
            entries = _file(lambda: workspace.list_dir(target))
            # The SDK knows two types: a link or a device is listed as a file, `kind` says
            # what it is (a link is never followed: its size is the link's own)
            return _json([{"name": e.name, "size": e.size, "mod_time": e.mtime,
                           "type": "directory" if e.kind == "directory" else "file",
                           "kind": e.kind} for e in entries])
        if action == "exists":
            return _json({"path": urllib.parse.unquote(rest),
                          "exists": _file(lambda: workspace.exists(target))})
        raise Refusal(404, "not_found", f"no endpoint {path}")

    def _post(self, path: str) -> tuple[int, bytes, str]:
        if path == "/execute":
            return _json(self._execute(self._body(MAX_COMMAND_BYTES, "the command")))
        if path == "/upload":
            name, data = self._upload()
            _file(lambda: self.server.files.write_file(name, data))
            return _json({"message": f"File '{name}' uploaded successfully."})
        self._body(MAX_COMMAND_BYTES, "the request")  # (read, so the connection stays usable)
        raise Refusal(404, "not_found", f"no endpoint {path}")

    def _execute(self, body: bytes) -> dict:
        try:
            request = json.loads(body)
            command = request["command"]
            timeout = request.get("timeout_seconds")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            # (RecursionError: JSON nested deeper than the parser's stack, within 1 MiB)
            raise Refusal(400, "usage", 'the body must be JSON {"command": "..."}') from None
        if not isinstance(command, str) or not command.strip():
            raise Refusal(400, "usage", "command must be a non-empty string")
        if len(command.encode(errors="surrogatepass")) >= MAX_ARGUMENT:
            raise Refusal(400, "usage", f"a command of {MAX_ARGUMENT} bytes or more (the "
                          "kernel's bound on one argument; write a script with /upload)")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise Refusal(400, "usage", "timeout_seconds must be a positive number")
        try:
            with self.server.command_slot(), _hangup(self.connection) as (cancel, spoiled):
                done = self.server.commands.exec(command, shell=True, timeout=timeout,
                                                 cancel=cancel)
            if spoiled.is_set():  # (what it sent meanwhile was dropped: no request follows)
                self.close_connection = True
        except StockadeError as exc:
            raise Refusal(400 if isinstance(exc, UsageError) else 500, exc.code,
                          exc.message) from None
        return {"stdout": done.stdout, "stderr": with_denials(done.stderr, done.denials),
                "exit_code": done.exit_code, "timed_out": done.timed_out,
                "truncated": done.truncated,
                "denials": [{"kind": d.kind, "detail": d.detail, "grant": d.grant}
                            for d in done.denials]}

    def _upload(self) -> tuple[str, bytes]:
        """The path and bytes of an /upload's "file" part."""
        declared = email.message.Message()
        declared["Content-Type"] = self.headers.get("Content-Type", "")
        boundary = declared.get_param("boundary")
        if declared.get_content_type() != "multipart/form-data" or not isinstance(boundary,
                                                                                  str):
            self._body(MAX_COMMAND_BYTES, "the request")
            raise Refusal(400, "usage", "an upload is multipart/form-data with a 'file' part")
        body = self._body(self.server.max_upload + (64 << 10), "the upload", "--max-upload")
        for headers, data in _parts(body, boundary.encode()):
            if headers.get_param("name", header="content-disposition") != "file":
                continue
            name = headers.get_filename()
            if not name:
                raise Refusal(400, "usage", "the 'file' part names no file (its filename)")
            if len(data) > self.server.max_upload:
                raise Refusal(413, "too_large", f"the upload is larger than --max-upload "
                              f"({self.server.max_upload} bytes)")
            return _relative(name), data
        raise Refusal(400, "usage", "an upload is multipart/form-data with a 'file' part")

    def _body(self, limit: int, what: str, knob: str | None = None) -> bytes:
        """The request's body (Content-Length or chunked), refused past `limit` bytes. The
        framing is read strictly: a lenient reading a proxy in front reads otherwise is a
        request smuggled past it."""
        chunked, length = self._framing()
        if length > limit:
            self._drain(length)
            self._too_large(what, limit, knob)
        if not chunked:
            return self.rfile.read(length)
        data, total = bytearray(), 0
        while True:
            line = self.rfile.readline(1 << 10)
            size = line.split(b";")[0].rstrip(b"\r\n")
            if not line.endswith(b"\n") or not _CHUNK_SIZE.fullmatch(size):
                self._malformed("a chunk size that is not 1 to 8 hex digits")
            if int(size, 16) == 0:
                while self.rfile.readline(1 << 16) not in (b"\r\n", b"\n", b""):
                    pass  # (trailers)
                break
            total += int(size, 16)
            if total > DRAIN_BYTES:
                self.close_connection = True
                break
            if total > limit:  # (checked before the chunk is read: past it, nothing is kept)
                self._drain(int(size, 16))
            else:
                data += self.rfile.read(int(size, 16))
            if self.rfile.readline(8) not in (b"\r\n", b"\n"):
                self._malformed("a chunk not ended by its line break")
        if total > limit:
            self._too_large(what, limit, knob)
        return bytes(data)

    def _framing(self) -> tuple[bool, int]:
        """Whether the body is chunked, and else its Content-Length, read strictly."""
        codings = self.headers.get_all("Transfer-Encoding") or []
        lengths = self.headers.get_all("Content-Length") or []
        if codings and lengths:
            self._malformed("both Transfer-Encoding and Content-Length")
        if codings:
            if codings != ["chunked"]:
                self._malformed(f"Transfer-Encoding {', '.join(codings)!r} (only 'chunked')")
            return True, 0
        if len(lengths) > 1 or (lengths and not _LENGTH.fullmatch(lengths[0])):
            self._malformed("a Content-Length that is not one number")
        return False, int(lengths[0]) if lengths else 0

    def _malformed(self, what: str) -> NoReturn:
        self.close_connection = True  # (where this request ends is not known)
        raise Refusal(400, "usage", f"a malformed request: {what}")

    def _drain(self, length: int) -> None:
        """Read and drop a refused body (or chunk) in 64 KiB pieces, up to DRAIN_BYTES (a
        client still sending would see its connection reset, not the answer), then end the
        connection."""
        self.close_connection = True
        drained = 0
        while drained < min(length, DRAIN_BYTES):
            chunk = self.rfile.read(min(1 << 16, length - drained))
            if not chunk:
                break
            drained += len(chunk)

    def _too_large(self, what: str, limit: int, knob: str | None) -> NoReturn:
        self.close_connection = True
        said = f" (the server's {knob})" if knob else ""
        raise Refusal(413, "too_large", f"{what} is larger than {limit} bytes{said}")


class _Head:
    """A connection's reader, its request heads bounded: while `left` is set (a head being
    read), at most that many bytes in all, then http.client's LineTooLong (431). http.server
    bounds each line and their number, not the head: 100 lines of 64 KiB each."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.left = raw, None

    def read(self, size: int = -1) -> bytes:
        return self.raw.read(size)

    def readline(self, size: int = -1) -> bytes:
        if self.left is None:
            return self.raw.readline(size)
        if self.left <= 0:
            raise http.client.LineTooLong(f"a request head past {MAX_HEAD} bytes")
        line = self.raw.readline(self.left if size < 0 else min(size, self.left))
        self.left -= len(line)
        return line

    def close(self) -> None:
        self.raw.close()


@contextlib.contextmanager
def _hangup(connection: socket.socket) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Two Events: `cancel`, set once the client ends its connection (EOF: closed, or its
    sending side shut, which Go's net/http and nginx take for gone too; or reset) while its
    command runs, whose tree is then killed; and `spoiled`, set once it sent more meanwhile.
    What it sends is read and dropped (a pipelined request is not served: the connection
    ends after the answer), so that its EOF is still seen; past HANGUP_EXTRA bytes the
    command is cancelled too, a client streaming forever being no reader of its answer."""
    cancel, spoiled, over, reading = (threading.Event(), threading.Event(), threading.Event(),
                                      threading.Lock())

    def watch() -> None:
        poller = select.poll()
        poller.register(connection, select.POLLIN | select.POLLRDHUP)
        extra = 0
        while not over.is_set():
            if not poller.poll(HANGUP_POLL * 1000):
                continue
            with reading:  # (no byte read once the command is over: it is the next request's)
                if over.is_set():
                    return
                try:
                    data = connection.recv(1 << 16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    spoiled.set()
                    extra += len(data)
                if not data or extra > HANGUP_EXTRA:
                    cancel.set()
                    return

    threading.Thread(target=watch, daemon=True).start()
    try:
        yield cancel, spoiled
    finally:
        with reading:
            over.set()


def _file(operation: Any) -> Any:
    """`operation()`, a Workspace file operation, with its refusal typed for HTTP."""
    try:
        return operation()
    except FileError as exc:
        raise Refusal(_STATUS.get(exc.code, 400), exc.code, exc.message, exc.grant) from None
    except StockadeError as exc:
        raise Refusal(400 if isinstance(exc, UsageError) else 500, exc.code,
                      exc.message) from None


def _relative(path: str) -> str:
    """A request's path, as the python-runtime reads it: relative to the workspace."""
    if "\0" in path:
        raise Refusal(400, "usage", "a path with a NUL byte")
    return path.lstrip("/") or "."


def _parts(body: bytes, boundary: bytes) -> Iterator[tuple[email.message.Message, bytes]]:
    """The parts of a multipart body, one at a time (the caller stops at the one it wants):
    each one's headers and its bytes, exactly. At most MAX_PARTS parts, each one's headers
    at most MAX_PART_HEAD bytes: a body of millions of empty parts is refused, not parsed."""
    delimiter = b"\r\n--" + boundary
    body = b"\r\n" + body
    start = body.find(delimiter)
    for _ in range(MAX_PARTS):
        if start < 0:
            return
        start += len(delimiter)
        if body.startswith(b"--", start):
            return
        end = body.find(delimiter, start)
        end = len(body) if end < 0 else end
        head = body.find(b"\r\n\r\n", start, min(end, start + MAX_PART_HEAD))
        if head < 0:
            raise Refusal(400, "usage", "a malformed multipart body (a part's headers unended "
                          f"within {MAX_PART_HEAD} bytes)")
        headers = email.message_from_bytes(body[start:head].lstrip(b" \t")
                                           .removeprefix(b"\r\n"))
        yield headers, body[head + 4:end]
        start = end if end < len(body) else -1
    raise Refusal(400, "usage", f"more than {MAX_PARTS} multipart parts before the 'file' one")


def _json(value: Any) -> tuple[int, bytes, str]:
    # UTF-8, not \uXXXX: a command's undecodable bytes (U+FFFD each) are 3 bytes of the
    # answer, not 6 (attack K5: 16 MiB of them were 96 MiB held per answer). A lone
    # surrogate (a file name's undecodable byte) stays JSON's escape, \udcXX, as before.
    return 200, json.dumps(value, ensure_ascii=False).encode(errors="backslashreplace"), \
        "application/json"


def serve(policy: Policy, *, workspace: str | os.PathLike | None = None,
          host: str = "127.0.0.1", port: int = 8888, allow_remote: bool = False,
          max_upload: int = DEFAULT_MAX_UPLOAD,
          max_concurrent: int = DEFAULT_MAX_CONCURRENT,
          max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
    """Serve `workspace` (default: the current directory) under `policy` until SIGTERM or
    SIGINT; the sandboxes die with the server. Binding other than loopback needs
    `allow_remote` (in a pod, whose network is the boundary)."""
    if not loopback(host) and not allow_remote:
        raise UsageError(f"--host {host}: not a loopback address; the server has no "
                         "authentication of its own, so binding it beyond this machine must "
                         "be asked for with --allow-remote (as in a pod, behind the "
                         "sandbox router)")
    if not 0 <= port < 65536:
        raise UsageError(f"--port {port}: not a port")
    if max_upload <= 0:
        raise UsageError("--max-upload must be a positive number of bytes")
    if max_concurrent <= 0:
        raise UsageError("--max-concurrent must be a positive number of commands")
    if max_connections <= 0:
        raise UsageError("--max-connections must be a positive number of connections")
    commands = Workspace(policy, workspace=workspace, sandboxes=max_concurrent)
    files = Workspace(policy, workspace=commands.root, sandboxes=FILE_SANDBOXES)
    try:
        commands.start()  # (a sandbox that cannot start here is said now, not per request)
        files.start()
        server = AgentSandboxServer(commands, files, host, port, max_upload=max_upload,
                                    allow_remote=allow_remote, max_concurrent=max_concurrent,
                                    max_connections=max_connections)
    except BaseException as exc:
        commands.close()
        files.close()
        if isinstance(exc, OSError):
            raise UsageError(f"--host {host} --port {port}: cannot listen: "
                             f"{exc.strerror}") from None
        raise
    signal.signal(signal.SIGTERM, _stop)  # (a pod's end: the sandboxes die with the server)
    shown = f"[{host}]" if ":" in host else host
    print(f"stockade: serving the agent-sandbox runtime on http://{shown}:"
          f"{server.server_address[1]} "
          f"(workspace {commands.root})", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except _Stopped:
        pass
    finally:
        server.server_close()


class _Stopped(Exception):
    pass


def _stop(*_: object) -> NoReturn:
    raise _Stopped


def _descriptor_limit() -> int | None:
    """This process's RLIMIT_NOFILE (soft), or None: unlimited, or no such limit (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft
