"""Network `allowlist`: the only way out is Stockade's proxy. Real children, a real upstream on
the host's loopback, and host-side checks that nothing else got through."""

from __future__ import annotations

import dataclasses
import http.server
import socket
import textwrap
import threading

import pytest
from conftest import PYTHON, policy_for

import stockade

pytestmark = pytest.mark.usefixtures("linux")


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.paths.append(self.path)
        body = b"upstream-body"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.paths = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# Child-side helper: a SOCKS5 CONNECT through the sandbox's proxy, then a GET of `path`.
SOCKS_GET = """
import socket, struct
def socks_get(address, port, path):
    s = socket.create_connection(('127.0.0.1', 3128), 10)
    s.sendall(b'\\x05\\x01\\x00'); s.recv(2)
    s.sendall(b'\\x05\\x01\\x00' + address + struct.pack('>H', port))
    code = s.recv(10)[1]
    if code:
        return code, None
    s.sendall(b'GET ' + path + b' HTTP/1.0\\r\\n\\r\\n')
    return code, s.recv(100).split(b' ')[1].decode()
def ipv4(text):
    return b'\\x01' + socket.inet_aton(text)
def name(text):
    return b'\\x03' + bytes([len(text)]) + text.encode()
"""


def allowlist(*allow: str) -> stockade.Policy:
    base = policy_for("read-only")
    return dataclasses.replace(base, network=dataclasses.replace(
        base.network, mode="allowlist", allow=allow))


def child(code: str, policy: stockade.Policy, workspace) -> stockade.Result:
    return stockade.run([PYTHON, "-c", textwrap.dedent(code)], policy, workspace=workspace)


def test_allowed_destination_is_reached_through_the_proxy(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    r = child(f"""
        import os, urllib.request
        print(os.environ['HTTP_PROXY'], os.environ['ALL_PROXY'], repr(os.environ['NO_PROXY']))
        print(urllib.request.urlopen('http://127.0.0.1:{port}/hello').read().decode())
    """, allowlist(f"127.0.0.1:{port}"), workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().splitlines() == [
        "http://127.0.0.1:3128 socks5h://127.0.0.1:3128 ''", "upstream-body"]
    assert upstream.paths == ["/hello"]
    assert r.violations == ()


def test_connect_tunnel_and_socks5_reach_an_allowed_destination(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    r = child(SOCKS_GET + textwrap.dedent(f"""
        import http.client, socket, struct
        tunnel = http.client.HTTPConnection('127.0.0.1', 3128, timeout=10)
        tunnel.set_tunnel('127.0.0.1', {port})
        tunnel.request('GET', '/via-connect')
        print(tunnel.getresponse().status)
        print(*socks_get(ipv4('127.0.0.1'), {port}, b'/via-socks'))
    """), allowlist(f"127.0.0.1:{port}"), workspace)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["200", "0", "200"]
    assert upstream.paths == ["/via-connect", "/via-socks"]


def test_unlisted_rebinding_and_metadata_destinations_are_denied_and_reported(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    r = child(f"""
        import urllib.request
        for url in ('http://unlisted.example/', 'http://localhost:{port}/rebound',
                    'http://169.254.169.254/latest/meta-data/', 'http://[::1]:{port}/'):
            try:
                urllib.request.urlopen(url, timeout=10)
                print('ALLOWED', url)
            except urllib.error.HTTPError as e:
                print(e.code, e.read().decode().strip()[:60])
    """, allowlist("localhost", f"localhost:{port}"), workspace)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 4 and all(line.startswith("403") for line in lines), lines
    assert upstream.paths == []  # the rebound name never reached the host's loopback
    denied = [v.detail for v in r.violations if v.kind == "network.denied"]
    assert len(denied) == 4
    assert any("unlisted.example" in d for d in denied)
    assert any("localhost" in d for d in denied)
    assert any("169.254.169.254" in d for d in denied)


def test_socks5_denial_uses_the_protocol_error_code(ws):
    workspace, _ = ws
    r = child(SOCKS_GET + "print(socks_get(name('denied.example'), 443, b'/')[0])",
              allowlist("allowed.example"), workspace)
    assert r.stdout.strip() == b"2"  # connection not allowed by ruleset


def test_bypassing_the_proxy_fails(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    spy = socket.socket()
    spy.bind(("127.0.0.1", 0))
    spy.listen()
    spy.settimeout(0.5)
    try:
        r = child(f"""
            import socket, errno
            def attempt(name, fn):
                try:
                    fn(); print(name, 'ALLOWED')
                except OSError as e:
                    print(name, 'denied', e.errno)
            attempt('tcp_host_loopback', lambda: socket.create_connection(('127.0.0.1', {port}), 2))
            spy = ('127.0.0.1', {spy.getsockname()[1]})
            attempt('tcp_spy', lambda: socket.create_connection(spy, 2))
            attempt('tcp_remote', lambda: socket.create_connection(('192.0.2.1', 80), 2))
            def udp():
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.sendto(b'x', ('127.0.0.1', 53)); s.settimeout(1); s.recv(1)
            attempt('udp_dns', udp)
            attempt('resolve', lambda: socket.getaddrinfo('example.com', 80))
            def listen():
                s = socket.socket(); s.bind(('0.0.0.0', 8080)); s.listen()
            attempt('bind', listen)
        """, allowlist(f"127.0.0.1:{port}"), workspace)
        with pytest.raises(TimeoutError):
            spy.accept()
    finally:
        spy.close()
    assert r.exit_code == 0, r.stderr
    assert "ALLOWED" not in r.stdout.decode(), r.stdout
    assert upstream.paths == []


def run_with_resolver(code: str, policy: stockade.Policy, workspace, names: dict[str, str]):
    """Launch through the production backend with the proxy's resolver mapping test names to
    loopback addresses (the system resolver is never touched)."""
    from stockade.launch.compile import CompileContext, compile_policy
    from stockade.launch.manager import execute
    from stockade.linux.backend import LinuxBackend

    def resolver(host: str) -> list[str]:
        return [names[host]] if host in names else []

    request = compile_policy(policy, [PYTHON, "-c", textwrap.dedent(code)],
                             CompileContext.current(workspace))
    return execute(LinuxBackend(resolver=resolver), request)


def test_an_allowed_test_domain_is_reached_by_http_and_socks5h(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    policy = allowlist(f"pkg.test:{port}", f"127.0.0.1:{port}")
    r = run_with_resolver(SOCKS_GET + textwrap.dedent(f"""
        import socket, struct, urllib.request
        print(urllib.request.urlopen('http://pkg.test:{port}/by-name').read().decode())
        print(*socks_get(name('pkg.test'), {port}, b'/by-socks5h'))
    """), policy, workspace, {"pkg.test": "127.0.0.1"})
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == ["upstream-body", "0", "200"]
    assert upstream.paths == ["/by-name", "/by-socks5h"]


def test_each_denial_is_in_the_result_log(ws, upstream):
    workspace, _ = ws
    port = upstream.server_port
    r = run_with_resolver(f"""
        import urllib.request
        for url in ('http://other.test:{port}/', 'http://10.1.2.3/', 'http://rebind.test/'):
            try:
                urllib.request.urlopen(url, timeout=10)
            except urllib.error.HTTPError as e:
                print(e.code)
    """, allowlist("rebind.test"), workspace, {"other.test": "127.0.0.1",
                                               "rebind.test": "127.0.0.1"})
    assert r.stdout.split() == [b"403"] * 3
    assert [(e["host"], e["decision"]) for e in r.network_log] == [
        ("other.test", "deny"), ("10.1.2.3", "deny"), ("rebind.test", "deny")]
    for entry in r.network_log:
        assert entry["request_id"] == r.request_id and entry["reason"] and entry["time"]
    assert upstream.paths == []


def test_a_name_refused_for_its_address_says_the_address_and_the_fix(ws):
    """Issue 32: a registry name resolving to a reserved address was refused with a result
    naming neither (only the network log did); the violation now names both."""
    workspace, _ = ws
    r = run_with_resolver("""
        import urllib.request
        try:
            urllib.request.urlopen('http://registry.test/simple/', timeout=10)
        except urllib.error.HTTPError as e:
            print(e.code)
    """, allowlist("registry.test"), workspace, {"registry.test": "198.18.0.7"})
    assert r.stdout.split() == [b"403"], r.stderr
    (violation,) = r.violations
    assert violation.kind == "network.denied"
    assert violation.detail.startswith("http registry.test:80: address_reserved (resolves to "
                                       "198.18.0.7, a reserved"), violation.detail
    assert 'allow "198.18.0.7:80" (--allow-domain 198.18.0.7:80)' in violation.detail


def test_the_cli_appends_the_network_log_as_json_lines(ws, tmp_path):
    workspace, _ = ws
    import json
    import os
    import subprocess
    import sys

    from conftest import PYTHON_ROOT
    log = tmp_path / "decisions.jsonl"
    code = ("import urllib.request as u\n"
            "try: u.urlopen('http://denied.test/', timeout=10)\n"
            "except Exception as e: print(e)")
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "run", "--allow-domain", "allowed.test",
         "--read", PYTHON_ROOT, "--network-log", str(log), "--workspace", str(workspace), "--",
         PYTHON, "-c", code],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["host"], e["port"], e["decision"]) for e in entries] == [
        ("denied.test", 80, "deny")]


def test_a_network_log_that_cannot_be_written_after_the_run_keeps_the_status(ws):
    """/dev/full opens, then refuses the lines: one line says so, the command's status stays."""
    workspace, _ = ws
    import os
    import subprocess
    import sys

    from conftest import PYTHON_ROOT
    code = ("import urllib.request as u\n"
            "try: u.urlopen('http://denied.test/', timeout=10)\n"
            "except Exception as e: raise SystemExit(5)")
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "run", "--allow-domain", "allowed.test",
         "--read", PYTHON_ROOT, "--network-log", "/dev/full", "--workspace", str(workspace),
         "--", PYTHON, "-c", code],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    assert ("stockade: output_failed: the network log could not be written to /dev/full (No "
            "space left on device)") in done.stderr.splitlines()


def test_stockade_proxy_runs_alone_and_logs_decisions(tmp_path):
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    log = tmp_path / "proxy.jsonl"
    proxy = subprocess.Popen(
        [sys.executable, "-m", "stockade", "proxy", "--allow", "allowed.test", "--listen",
         f"127.0.0.1:{port}", "--log", str(log)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stderr=subprocess.PIPE, text=True)
    try:
        assert "proxy on 127.0.0.1" in proxy.stderr.readline()
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{port}"}))
        with pytest.raises(urllib.error.HTTPError) as info:
            opener.open("http://denied.test/", timeout=10)
        assert info.value.code == 403
    finally:
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(10) == 0
    deadline = time.monotonic() + 5
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (entry["host"], entry["decision"], entry["reason"]) == (
        "denied.test", "deny", "not_allowed")
