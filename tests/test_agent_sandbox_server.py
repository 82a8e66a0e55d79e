"""`stockade serve --agent-sandbox`'s own decisions, over raw HTTP (the SDK's end-to-end tests
are tests/integrations/test_agent_sandbox.py): it binds beyond loopback only when asked,
every request body is bounded, a refused one answered 413 `too_large` (naming the knob) with
nothing written and the server still serving, and commands that hang hold up neither its
health nor its file operations (past --max-concurrent, 503 `busy` at once)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import gone, marked

from stockade.integrations.agent_sandbox import loopback

MAX_UPLOAD = 4096
REPO = str(Path(__file__).resolve().parents[1])  # (the server imports this tree's package)
JSON = {"Content-Type": "application/json"}
PROMPT = 10.0  # seconds an answer that waits for no command may take (on a loaded machine)


def stockade(*args: str, cwd, stderr=subprocess.PIPE,
             python: tuple[str, ...] = ("-m", "stockade")) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *python, *args], cwd=str(cwd),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=stderr, text=True, env={**os.environ, "PYTHONPATH": REPO})


def start(root: Path, *flags: str,
          source: tuple[str, str] = ("--preset", "workspace-write"),
          python: tuple[str, ...] = ("-m", "stockade")) -> tuple[subprocess.Popen, int]:
    """A server over `root` under `source` (a --preset or --policy) (its stderr in server.log
    beside it), and its port; `python`: how the interpreter runs stockade's CLI."""
    log = root.parent / "server.log"  # (a file: a pipe nobody reads could fill and block it)
    with log.open("w") as stderr:
        process = stockade("serve", "--agent-sandbox", "--port", "0", "--workspace", str(root),
                           *source, *flags, cwd=root, stderr=stderr, python=python)
    deadline = time.monotonic() + 60
    while "serving" not in (said := log.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, said
        time.sleep(0.05)
    return process, int(said.split("http://127.0.0.1:")[1].split()[0])


def stop(process: subprocess.Popen, root: Path) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, (root.parent / "server.log").read_text()


@pytest.fixture
def served(ws, linux) -> Iterator[tuple[int, int]]:
    """The server's port and process id."""
    root, _ = ws
    process, port = start(root, "--max-upload", str(MAX_UPLOAD))
    yield port, process.pid
    stop(process, root)


@pytest.fixture
def server(served) -> int:
    return served[0]


def exchange(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """The status, headers and body of the server's answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = headers or {}
        connection.request(method, path, body=body, headers=headers,
                           encode_chunked="Transfer-Encoding" in headers)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def request(port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict]:
    status, _, data = exchange(port, method, path, body, headers)
    return status, json.loads(data)


def execute(port: int, command: str) -> tuple[int, dict]:
    return request(port, "POST", "/execute", json.dumps({"command": command}).encode(), JSON)


def raw(port: int, data: bytes, shut: bool = True) -> list[bytes]:
    """The statuses of what the server answers to `data` sent as is (then, if `shut`, the
    sending side shut, so a server keeping the connection reads its end; a request that runs
    a command must rather ask for `Connection: close`: a client's end cancels its command)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(data)
        if shut:
            connection.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := connection.recv(1 << 16):
            answer += chunk
    return re.findall(rb"^HTTP/1.1 ([0-9]{3})", answer, re.MULTILINE)


def multipart(name: str, data: bytes) -> tuple[bytes, dict]:
    body = (b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" +
            name.encode() + b"\"\r\n\r\n" + data + b"\r\n--B--\r\n")
    return body, {"Content-Type": "multipart/form-data; boundary=B"}


def test_binding_beyond_loopback_must_be_asked_for(tmp_path):
    assert all(loopback(host) for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(loopback(host) for host in ("0.0.0.0", "::", "10.0.0.1", "pod.example"))
    for flags, said in ((["--agent-sandbox", "--host", "0.0.0.0"], "--allow-remote"),
                        (["--host", "127.0.0.1"], "--agent-sandbox"),
                        (["--agent-sandbox", "--max-concurrent", "0"], "--max-concurrent")):
        process = stockade("serve", "--port", "0", *flags, cwd=tmp_path)
        _, error = process.communicate(timeout=60)
        assert process.returncode == 2 and "stockade: usage:" in error and said in error, error


def test_request_bodies_are_bounded_and_a_refusal_writes_nothing(server, ws):
    root, _ = ws
    status, body = request(server, "POST", "/execute", b"x" * (2 << 20), JSON)
    assert (status, body["error"]) == (413, "too_large")
    upload, headers = multipart("big.bin", b"y" * (MAX_UPLOAD + 1))
    status, body = request(server, "POST", "/upload", upload, headers)
    assert (status, body["error"]) == (413, "too_large") and "--max-upload" in body["message"]
    past = upload + b"z" * (64 << 10)  # (past the bound with the multipart framing's margin)
    status, body = request(server, "POST", "/upload", past, headers)
    assert (status, body["error"]) == (413, "too_large")
    chunks = iter([past[:1000], past[1000:]])  # http.client sends an iterable chunked
    status, body = request(server, "POST", "/upload", chunks,  # type: ignore[arg-type]
                           {**headers, "Transfer-Encoding": "chunked"})
    assert (status, body["error"]) == (413, "too_large")
    assert os.listdir(root) == []
    exact, headers = multipart("fits.bin", b"y" * MAX_UPLOAD)
    assert request(server, "POST", "/upload", exact, headers)[0] == 200
    assert (root / "fits.bin").read_bytes() == b"y" * MAX_UPLOAD
    status, body = request(server, "POST", "/execute", json.dumps({"command": "echo ok"}).encode(),
                           JSON)
    assert (status, body["stdout"], body["exit_code"]) == (200, "ok\n", 0)


def test_malformed_requests_get_typed_answers(server, ws):
    root, _ = ws
    for method, path, body, headers, code in (
            ("POST", "/execute", b"{", JSON, "usage"),
            ("POST", "/execute", b'{"command": ["ls"]}', JSON, "usage"),
            ("POST", "/upload", b"plain", {"Content-Type": "text/plain"}, "usage"),
            ("GET", "/download/a%00b", None, {}, "usage"),
            ("GET", "/no-such-endpoint", None, {}, "not_found"),
            ("POST", "/elsewhere", b"", {}, "not_found")):
        status, answer = request(server, method, path, body, headers)
        assert answer["error"] == code and 400 <= status < 500, (path, answer)
    started = time.monotonic()
    assert request(server, "GET", "/")[1]["status"] == "ok"
    assert time.monotonic() - started < 5 and os.listdir(root) == []


def test_what_a_web_page_can_send_is_refused(server, ws):
    """A page the user visits can POST to loopback (a "simple" request, no preflight) and can
    rebind its own name to 127.0.0.1: a request with an Origin, a foreign Host, or an /execute
    that is not JSON is refused, and nothing runs or is written."""
    root, _ = ws
    run = json.dumps({"command": "touch ran"}).encode()
    upload, form = multipart("planted", b"x")
    for path, body, headers, code in (
            ("/execute", run, {**JSON, "Origin": "http://evil.example"}, "cross_origin"),
            ("/upload", upload, {**form, "Origin": "null"}, "cross_origin"),
            ("/execute", run, {**JSON, "Host": f"rebind.evil.example:{server}"}, "foreign_host"),
            ("/upload", upload, {**form, "Host": "127.0.0.1"}, "foreign_host"),
            ("/execute", run, {"Content-Type": "text/plain;charset=UTF-8"}, "not_json"),
            ("/execute", run, {}, "not_json")):
        status, answer = request(server, "POST", path, body, headers)
        assert (status, answer["error"]) == (403, code), (path, headers, answer)
    status, answer = request(server, "GET", "/list/.", None, {"Host": "evil.example"})
    assert (status, answer["error"]) == (403, "foreign_host")
    assert os.listdir(root) == []
    for host in (f"localhost:{server}", f"[::1]:{server}"):
        assert request(server, "POST", "/execute", run, {**JSON, "Host": host})[0] == 200
    assert os.listdir(root) == ["ran"]


def test_request_framing_is_read_strictly(server, ws):
    """Attack A6 and A1: framing a proxy in front could read otherwise (a sign, 0x or _ in a
    size, a Transfer-Encoding merely containing "chunked", both framings, a GET's body) is
    refused 400 and the connection closed, so nothing inside it runs as a request."""
    root, _ = ws
    run = json.dumps({"command": "touch ran"}).encode()
    head = (f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
            "Content-Type: application/json\r\n").encode()
    inner = head + b"Content-Length: %d\r\n\r\n" % len(run) + run
    chunk, length = b"%x" % len(run), b"%d" % len(run)
    for size in (b"0x" + chunk, b"+" + chunk, chunk[:1] + b"_" + chunk[1:], b" " + chunk):
        framing = b"Transfer-Encoding: chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n" % (size, run)
        assert raw(server, head + framing) == [b"400"], size
    for size in (b"+" + length, length[:1] + b"_" + length[1:]):
        assert raw(server, head + b"Content-Length: %s\r\n\r\n%s" % (size, run)) == [b"400"]
    for framing in (b"Transfer-Encoding: xchunked\r\n", b"Transfer-Encoding: chunked, chunked\r\n",
                    b"Transfer-Encoding: chunked\r\nContent-Length: 0\r\n",
                    b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(run), len(run))):
        assert raw(server, head + framing + b"\r\n" + b"%x\r\n" % len(run) + run
                   + b"\r\n0\r\n\r\n") == [b"400"], framing
    assert raw(server, head + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n" + run) == [b"400"]
    smuggled = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
                f"Content-Length: {len(inner)}\r\n\r\n").encode() + inner
    assert raw(server, smuggled) == [b"400"]
    assert os.listdir(root) == []
    assert raw(server, head + b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n%X;x=1\r\n"
               % len(run) + run + b"\r\n0\r\n\r\n", shut=False) == [b"200"]
    assert os.listdir(root) == ["ran"]


def test_a_leniently_readable_head_is_refused(server, ws):
    """Attack K7: a header line with whitespace before its colon or none at all ends the
    headers for http.server's parser, so a `Content-Length : N` a proxy in front frames by
    (a request smuggled in the body) and an Origin after a colon-less line went unseen. Each
    is refused 400 (RFC 9112 5.1) and the connection closed: nothing runs."""
    root, _ = ws
    run = json.dumps({"command": "touch ran"}).encode()
    head = (f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
            "Content-Type: application/json\r\n").encode()
    inner = head + b"Content-Length: %d\r\n\r\n" % len(run) + run
    for spaced in (b"Content-Length : %d", b"Content-Length\t: %d"):
        outer = (f"POST /nothing HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n").encode()
        assert raw(server, outer + spaced % len(inner) + b"\r\n\r\n" + inner) == [b"400"]
    for odd in (b"no colon here\r\n", b" folded\r\n"):
        assert raw(server, head + b"Content-Length: %d\r\n" % len(run) + odd
                   + b"Origin: http://example.com\r\n\r\n" + run) == [b"400"], odd
    assert os.listdir(root) == []
    status, answer = request(server, "POST", "/execute", b"[" * 100_000, JSON)
    assert (status, answer["error"]) == (400, "usage")
    status, answer = execute(server, "echo fine")
    assert (status, answer["stdout"]) == (200, "fine\n")


def test_a_chunk_past_the_limit_is_never_held(served):
    """Attack A2: one chunk declared far past the /execute limit is dropped as it arrives
    (the limit checked before it is read), not read whole into memory and then refused."""
    port, pid = served
    def peak() -> int:
        status = open(f"/proc/{pid}/status").read()
        return int(re.search(r"VmHWM:\s+([0-9]+) kB", status).group(1)) << 10
    before = peak()
    size = 128 << 20
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                           f"\r\n{size:x}\r\n".encode())
        piece = b"x" * (1 << 20)
        for _ in range(size >> 20):
            connection.sendall(piece)
        connection.sendall(b"\r\n0\r\n\r\n")
        assert connection.recv(1 << 16).startswith(b"HTTP/1.1 413")
    assert peak() - before < size // 2, (before, peak())


def test_a_multipart_upload_is_parsed_only_up_to_its_file_part(server, ws):
    """Attack A3: an upload's parts are bounded (16, each one's headers 8 KiB) and parsing
    stops at the "file" part: millions of empty parts cost nothing, and what follows the
    file is not read."""
    root, _ = ws
    form = {"Content-Type": "multipart/form-data; boundary=B"}
    empty = b"--B\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n\r\n"
    upload, _ = multipart("kept", b"data")
    for before, code in ((empty * 2, 200), (empty * 16, 400),
                         (b"--B\r\nX: " + b"y" * (8 << 10) + b"\r\n\r\n\r\n", 400)):
        status, answer = request(server, "POST", "/upload", before + upload, form)
        assert status == code, answer
    after = upload.removesuffix(b"--B--\r\n") + b"--B\r\nno header end" + empty * 50
    status, answer = request(server, "POST", "/upload", after.replace(b"kept", b"also"), form)
    assert status == 200, answer
    assert sorted(os.listdir(root)) == ["also", "kept"]


def test_what_the_kernel_refuses_is_a_typed_client_error(server, ws):
    """Attack A5: a name longer than the kernel takes, a FIFO written to, a command past one
    argument's bound get a 4xx (a 5xx, the SDK retries), typed, and nothing is written."""
    root, _ = ws
    def run(command: str) -> tuple[int, dict]:
        return request(server, "POST", "/execute", json.dumps({"command": command}).encode(),
                       JSON)
    assert run("mkfifo fifo")[0] == 200
    long = "a" * 300
    for method, path, body, headers, expected in (
            ("POST", "/upload", *multipart(long, b"x"), (400, "name_too_long")),
            ("GET", f"/download/{long}", None, {}, (400, "name_too_long")),
            ("GET", f"/list/{long}", None, {}, (400, "name_too_long")),
            ("POST", "/upload", *multipart("fifo", b"x"), (409, "not_a_regular_file"))):
        status, answer = request(server, method, path, body, headers)
        assert (status, answer["error"]) == expected, (path[:20], answer)
    status, answer = run("true " + "x" * (128 << 10))
    assert (status, answer["error"]) == (400, "usage"), answer
    status, answer = run("echo \ud800")  # (no byte string holds it: it once lost the sandbox)
    assert (status, answer["error"]) == (400, "usage"), answer
    assert os.listdir(root) == ["fifo"]


def test_request_heads_are_bounded_in_size_time_and_number(ws, linux):
    """Attacks K2/K3: a request head was bounded per line (64 KiB, 100 of them: 6.4 MiB a
    connection) and per read (a byte every 20 s held a connection for ever), and connections
    not at all (a thousand of them exhausted the descriptors; accept then spun). Now a head
    is 64 KiB in all (431), whole within HEAD_SECONDS (here 3) or the connection ends, and
    past --max-connections a connection is answered 503 `busy` at once and closed."""
    root, _ = ws
    patched = ("-c", "import sys, stockade.integrations.agent_sandbox as server; "
               "server.HEAD_SECONDS = 3; from stockade.program import main; sys.exit(main())")
    process, port = start(root, "--max-connections", "4", python=patched)
    try:
        big = b"X-Big: " + b"x" * (40 << 10) + b"\r\n"
        assert raw(port, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
                   + 2 * big + b"\r\n") == [b"431"]
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
            slow.sendall(b"GET / HTTP/1.1\r\n")
            with pytest.raises(OSError):  # (reset by the server, or EPIPE)
                while time.monotonic() - began < 20:
                    slow.sendall(b"X")
                    time.sleep(0.5)
        assert time.monotonic() - began < 10, "a head sent a byte at a time was held"
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(4)]
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as one_more:
            answer = one_more.recv(1 << 16)
        assert answer.startswith(b"HTTP/1.1 503") and b"--max-connections" in answer, answer
        for connection in held:
            connection.close()
        deadline = time.monotonic() + PROMPT
        while True:
            try:
                if request(port, "GET", "/")[0] == 200:
                    break
            except (OSError, http.client.HTTPException, ValueError):
                pass
            assert time.monotonic() < deadline, "health stayed refused"
            time.sleep(0.1)
    finally:
        stop(process, root)


def test_undecodable_output_is_answered_in_utf8(server):
    """Attack K5 (in part): a command's undecodable bytes became `\\ufffd`, 6 bytes of the
    answer each; the answer is UTF-8 JSON now, 3 bytes each, and decodes the same."""
    body = json.dumps({"command": "head -c 1048576 /dev/zero | tr '\\0' '\\377'"}).encode()
    status, headers, data = exchange(server, "POST", "/execute", body, JSON)
    assert status == 200 and json.loads(data)["stdout"] == "\ufffd" * (1 << 20)
    assert len(data) < 3.5 * (1 << 20), len(data)
    assert execute(server, "touch \"$(printf 'odd-\\377')\"")[0] == 200
    assert request(server, "GET", "/list/.") == (200, [{"name": "odd-\udcff", "size": 0,
                                                       "type": "file", "kind": "file",
                                                       "mod_time": pytest.approx(time.time(),
                                                                                 abs=60)}])


def test_exists_looks_up_the_name_alone(ws, linux):
    """Attack K8: /exists listed the whole parent directory, so a name in a directory whose
    listing is past limits.output (300k files) was 413 `too_large` after seconds. Now the name
    alone is looked up (a link counts, not followed; a path outside is still refused)."""
    root, outside = ws
    policy = root.parent / "small-output.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\n[limits]\noutput = "1KiB"\n')
    (root / "big").mkdir()
    for n in range(100):
        (root / "big" / f"a-name-long-enough-to-fill-the-listing-{n:03}").touch()
    (root / "link").symlink_to(outside)
    process, port = start(root, source=("--policy", str(policy)))
    try:
        assert request(port, "GET", "/list/big")[0] == 413  # (the listing is past 1 KiB)
        for path, there in (("big/a-name-long-enough-to-fill-the-listing-007", True),
                            ("big/none", False), ("none/x", False), ("link", True),
                            ("big/a-name-long-enough-to-fill-the-listing-007/x", False),
                            ("", True), ("big/..", True), ("big", True)):
            status, answer = request(port, "GET", f"/exists/{path}")
            assert (status, answer.get("exists")) == (200, there), (path, answer)
        status, answer = request(port, "GET", "/exists/link/x")
        assert (status, answer["error"]) == (403, "symlink_refused")
        status, answer = request(port, "GET", "/exists/..%2Fx")
        assert (status, answer["error"]) == (403, "outside_workspace")
    finally:
        stop(process, root)


def test_hung_commands_hold_up_neither_health_nor_files_and_one_more_is_refused(ws, linux):
    """Attack A7: 8 commands that hang (the default --max-concurrent) once held up every other
    request, health and file operations included, and a 9th command queued behind them. Now
    health (which reports the busy slots) and every file operation answer promptly, a 9th
    command is refused at once, 503 `busy` with Retry-After and nothing run, a client that
    hangs up has its command's tree killed and its slot freed, and once the server stops,
    nothing it started runs on."""
    root, _ = ws
    process, port = start(root)
    markers = [f"{600 + n}.{os.getpid()}" for n in range(8)]
    clients = []
    try:
        for marker in markers:  # (each request sent, its answer never read)
            client = socket.create_connection(("127.0.0.1", port), timeout=30)
            body = json.dumps({"command": f"sleep {marker}"}).encode()
            client.sendall(f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(body)}"
                           "\r\n\r\n".encode() + body)
            clients.append(client)
        deadline = time.monotonic() + 120
        while not all(marked(marker) for marker in markers):
            assert time.monotonic() < deadline, [marker for marker in markers
                                                 if not marked(marker)]
            time.sleep(0.1)

        began = time.monotonic()
        status, health = request(port, "GET", "/")
        assert (status, health["status"], health["executing"], health["max_concurrent"]) == (
            200, "ok", 8, 8)
        upload, form = multipart("notes/kept.txt", b"kept\n")
        assert request(port, "POST", "/upload", upload, form)[0] == 200
        assert exchange(port, "GET", "/download/notes/kept.txt")[::2] == (200, b"kept\n")
        assert [entry["name"] for entry in request(port, "GET", "/list/notes")[1]] == [
            "kept.txt"]
        assert request(port, "GET", "/exists/notes/kept.txt")[1]["exists"]
        assert time.monotonic() - began < PROMPT, "health or a file operation waited"

        began = time.monotonic()
        status, headers, data = exchange(port, "POST", "/execute",
                                         json.dumps({"command": "touch ran"}).encode(), JSON)
        refused = json.loads(data)
        assert (status, refused["error"], headers["Retry-After"]) == (503, "busy", "1"), refused
        assert "--max-concurrent" in refused["message"]
        assert time.monotonic() - began < PROMPT and not (root / "ran").exists()

        clients.pop().close()  # (a client gone: nobody reads its answer)
        assert gone(markers[-1], within=PROMPT), marked(markers[-1])
        deadline = time.monotonic() + PROMPT
        while request(port, "GET", "/")[1]["executing"] != 7:
            assert time.monotonic() < deadline, "the slot stayed taken"
            time.sleep(0.05)
        status, freed = execute(port, "echo freed")
        assert (status, freed["stdout"]) == (200, "freed\n"), freed
        started = descendants(process.pid)
    finally:
        stop(process, root)
    assert all(gone(marker, within=PROMPT) for marker in markers[:-1])
    deadline = time.monotonic() + PROMPT
    while left := [pid for pid in started if running(pid)]:
        assert time.monotonic() < deadline, f"left running after the server stopped: {left}"
        time.sleep(0.1)
    for client in clients:
        client.close()


def test_bytes_sent_while_a_command_runs_do_not_end_the_hangup_watch(server):
    """Attack K1: the watch for a client's hang-up ended at its first byte after the request
    (taken for a pipelined one), so /execute, one byte and a close left the command running
    and its slot held for limits.timeout. Now what it sends is dropped and its close still
    kills the command's tree; past 64 KiB so sent the command is cancelled too; and a
    connection that sent more ends with the command's answer (nothing is read as a request)."""
    def begin(marker: str) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", server), timeout=30)
        body = json.dumps({"command": f"sleep {marker}; echo done"}).encode()
        client.sendall(f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{server}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}"
                       "\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 60
        while not marked(marker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return client

    one, flood, answered = (f"{n}0{os.getpid()}" for n in (7, 8, 1))
    client = begin(one)
    client.sendall(b"x")
    time.sleep(3 * 0.1)  # (a few of the watch's looks)
    client.close()
    assert gone(one, within=PROMPT), "a byte then a close left the command running"
    client = begin(flood)
    client.sendall(b"x" * (128 << 10))
    assert gone(flood, within=PROMPT), "a client streaming while its command ran"
    client.close()
    deadline = time.monotonic() + PROMPT
    while request(server, "GET", "/")[1]["executing"]:
        assert time.monotonic() < deadline, "a slot stayed taken"
        time.sleep(0.05)
    with begin(f"1.{answered}") as client:
        client.sendall(b"GET / HTTP/1.1\r\n")
        answer = b""
        while chunk := client.recv(1 << 16):
            answer += chunk
    assert re.findall(rb"^HTTP/1.1 ([0-9]{3})", answer, re.MULTILINE) == [b"200"], answer
    assert b"Connection: close" in answer and b"done" in answer


def descendants(pid: int) -> set[int]:
    """The processes below `pid` (host pids, through any pid namespace)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, below = set(), [pid]
    while below:
        for child in children.get(below.pop(), []):
            found.add(child)
            below.append(child)
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a process still running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
