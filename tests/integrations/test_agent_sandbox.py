"""`stockade serve --agent-sandbox` end to end with the SDK nobody here wrote,
kubernetes-sigs/agent-sandbox's `k8s-agent-sandbox`: its own `Sandbox` handle in direct-URL
mode, and its claim flow (`SandboxClient.create_sandbox`: create a SandboxClaim, watch it until
Ready, connect to the pod, run, delete) against k8s_double.py, a TEST DOUBLE of the Kubernetes
API (not a cluster: no cluster runs here). The runtime under test is real: every command and
file operation runs in the Stockade sandbox. Hostile requests (a path out, a link a command
planted, an upload past the bound, a command trying the policy's denials) get typed answers,
and nothing changes outside the workspace."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import gone, marked
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import SandboxRequestError, SandboxWarmPoolNotFoundError
from k8s_agent_sandbox.k8s_helper import K8sHelper
from k8s_agent_sandbox.models import (
    SandboxDirectConnectionConfig,
    SandboxInClusterConnectionConfig,
)
from k8s_agent_sandbox.sandbox import Sandbox
from k8s_double import KubernetesDouble
from kubernetes import client as k8s

pytestmark = pytest.mark.usefixtures("linux")

POOL = "stockade-pool"


class Server:
    """A running `stockade serve --agent-sandbox` over `root` (its stderr in a file)."""

    def __init__(self, root, *flags: str) -> None:
        self.log = root.parent / "server.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stockade", "serve", "--agent-sandbox", "--port", "0",
             "--workspace", str(root), *flags], cwd=str(root), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
            env={"HOME": os.environ.get("HOME", "/"), "PATH": os.environ["PATH"],
                 "STOCKADE_STATE_DIR": os.environ["STOCKADE_STATE_DIR"]})
        deadline = time.monotonic() + 60
        while "serving" not in (said := self.log.read_text()):
            assert self.process.poll() is None and time.monotonic() < deadline, said
            time.sleep(0.05)
        self.port = int(said.split("http://127.0.0.1:")[1].split()[0])
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0, self.log.read_text()


@pytest.fixture
def serve(ws) -> Iterator:
    started = []

    def start(*flags: str) -> Server:
        started.append(Server(ws[0], *flags))
        return started[-1]
    yield start
    for server in started:
        server.stop()


@pytest.fixture
def kubernetes() -> Iterator[KubernetesDouble]:
    with KubernetesDouble(POOL) as double:
        yield double


def api_client(double: KubernetesDouble) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = double.url
    return k8s.ApiClient(configuration)


def direct(server: Server, double: KubernetesDouble) -> Sandbox:
    """The SDK's own handle in direct-URL mode (its K8s helper, which it asks for the pod's IP
    to put in a router header, talks to the double, which has no such Sandbox)."""
    return Sandbox(claim_name="direct", sandbox_id="direct",
                   connection_config=SandboxDirectConnectionConfig(api_url=server.url),
                   k8s_helper=K8sHelper(api_client=api_client(double)))


def refusal(raised: pytest.ExceptionInfo) -> tuple[int, dict]:
    error = raised.value
    assert isinstance(error, SandboxRequestError)
    return error.status_code, json.loads(error.response.text)


def test_the_sdks_direct_handle_runs_commands_and_moves_files(ws, serve, kubernetes):
    root, _ = ws
    sandbox = direct(serve("--preset", "workspace-write"), kubernetes)
    ran = sandbox.commands.run("echo hi > a.txt; cat a.txt; pwd; echo err >&2; exit 3")
    assert (ran.stdout, ran.stderr, ran.exit_code) == (f"hi\n{root}\n", "err\n", 3)
    assert (root / "a.txt").read_text() == "hi\n"
    assert sandbox.commands.run("no-such-tool").exit_code == 127
    slow = sandbox.commands.run("sleep 30", command_timeout=1)
    assert slow.timed_out and slow.exit_code == 124

    blob = bytes(range(256)) * 64 + b"\r\n--tail\r\n"  # (multipart's own bytes, kept exact)
    sandbox.files.write("notes/blob.bin", blob)
    assert (root / "notes" / "blob.bin").read_bytes() == blob
    assert sandbox.files.read("notes/blob.bin") == blob
    sandbox.files.write("notes/streamed.txt", io.BytesIO(b"x" * 200_000))  # (chunked)
    assert (root / "notes" / "streamed.txt").read_bytes() == b"x" * 200_000
    listed = {entry.name: entry for entry in sandbox.files.list("notes")}
    assert set(listed) == {"blob.bin", "streamed.txt"}
    assert listed["blob.bin"].type == "file" and listed["blob.bin"].size == len(blob)
    assert listed["blob.bin"].modified.timestamp() == pytest.approx(
        (root / "notes" / "blob.bin").stat().st_mtime)
    assert [entry.type for entry in sandbox.files.list("")] == ["file", "directory"]
    assert sandbox.files.exists("notes/blob.bin") and sandbox.files.exists("notes")
    assert not sandbox.files.exists("notes/none") and not sandbox.files.exists("none/x")
    sandbox.close_connection()


def test_the_sdks_claim_flow_creates_waits_runs_and_deletes(ws, serve, kubernetes):
    root, _ = ws
    server = serve("--preset", "workspace-write")
    claims = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims"
    sandboxes = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes"
    # in-cluster mode: the SDK reaches the pod at the IP the Sandbox's status gives (loopback)
    sdk = SandboxClient(connection_config=SandboxInClusterConnectionConfig(
        server_port=server.port), api_client=api_client(kubernetes))
    sandbox = sdk.create_sandbox(warmpool=POOL, namespace="default", sandbox_ready_timeout=30)
    assert sandbox.sandbox_id.startswith(POOL) and sandbox.status()[0] == "SandboxReady"
    assert sandbox.commands.run("echo made > made.txt && ls").stdout == "made.txt\n"
    assert (root / "made.txt").read_text() == "made\n"
    assert sandbox.files.read("made.txt") == b"made\n"
    claim = sandbox.claim_name
    sandbox.terminate()
    assert kubernetes.claims == {} and kubernetes.sandboxes == {}
    assert ("POST", claims) in kubernetes.calls and ("GET", claims) in kubernetes.calls
    assert ("GET", f"{sandboxes}/{sandbox.sandbox_id}") in kubernetes.calls
    assert kubernetes.calls[-1] == ("DELETE", f"{claims}/{claim}")
    assert {path for _, path in kubernetes.calls} <= {
        claims, f"{claims}/{claim}", f"{sandboxes}/{sandbox.sandbox_id}"}

    # a pool the controller does not have: the SDK's typed error, and its claim rolled back
    with pytest.raises(SandboxWarmPoolNotFoundError):
        sdk.create_sandbox(warmpool="no-such-pool", sandbox_ready_timeout=10)
    assert kubernetes.claims == {}


def test_hostile_paths_and_planted_links_are_refused_typed(ws, serve, kubernetes):
    root, outside = ws
    (outside / "secret").write_text("outside\n")
    server = serve("--preset", "workspace-write")
    sandbox = direct(server, kubernetes)
    before = sorted(os.listdir(outside))
    # a command cannot reach the server that runs it (its loopback is its own)
    reach = sandbox.commands.run(f"python3 -c 'import socket; socket.create_connection("
                                 f"(\"127.0.0.1\", {server.port}), 5)'")
    assert reach.exit_code == 1 and "Error: [Errno" in reach.stderr, reach  # (refused)

    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.read("../outside/secret", allow_unsafe_paths=True)
    assert refusal(raised)[0] == 403 and refusal(raised)[1]["error"] == "outside_workspace"
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.write("../outside/new", b"x", allow_unsafe_paths=True)
    assert refusal(raised)[1]["error"] == "outside_workspace"
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.list("../outside")
    assert refusal(raised)[1]["error"] == "outside_workspace"
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.exists("../outside/secret")
    assert refusal(raised)[1]["error"] == "outside_workspace"
    # an absolute path is the workspace's, as the python-runtime reads it
    sandbox.files.write("/etc/passwd", b"mine\n", allow_unsafe_paths=True)
    assert (root / "etc" / "passwd").read_text() == "mine\n"

    # links a command planted: never followed by a later file operation
    planted = sandbox.commands.run(f"ln -s {outside} out && ln -s {outside}/secret s")
    assert planted.exit_code == 0, planted.stderr
    for operation in (lambda: sandbox.files.read("s"), lambda: sandbox.files.read("out/secret"),
                      lambda: sandbox.files.write("s", b"over\n"),
                      lambda: sandbox.files.write("out/new", b"x"),
                      lambda: sandbox.files.list("out")):
        with pytest.raises(SandboxRequestError) as raised:
            operation()
        assert refusal(raised)[0] == 403 and refusal(raised)[1]["error"] == "symlink_refused"
    listed = {entry.name: entry.type for entry in sandbox.files.list("")}
    assert listed["s"] == "file" and listed["out"] == "file"  # (links, listed, not followed)
    assert sandbox.files.exists("s")

    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.read("missing")
    assert refusal(raised)[0] == 404 and refusal(raised)[1]["error"] == "not_found"
    # the command itself cannot write outside either: outside is not in its view
    tried = sandbox.commands.run(f"echo x > {outside}/new; echo x > {outside}/secret")
    assert tried.exit_code != 0 and "cannot create" in tried.stderr
    assert sorted(os.listdir(outside)) == before
    assert (outside / "secret").read_text() == "outside\n"


def test_an_upload_past_the_bound_is_refused_and_writes_nothing(ws, serve, kubernetes):
    root, _ = ws
    sandbox = direct(serve("--preset", "workspace-write", "--max-upload", "65536"), kubernetes)
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.write("big.bin", b"x" * (4 << 20))
    status, body = refusal(raised)
    assert (status, body["error"]) == (413, "too_large") and "--max-upload" in body["message"]
    assert not (root / "big.bin").exists()
    # a file the command made larger than the bound is not sent either
    assert sandbox.commands.run("head -c 100000 /dev/zero > made.bin").exit_code == 0
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.read("made.bin")
    assert refusal(raised)[1]["error"] == "too_large"
    sandbox.files.write("small.bin", b"y" * 65536)  # (at the bound: taken)
    assert (root / "small.bin").read_bytes() == b"y" * 65536


def test_the_policy_is_fixed_at_start_and_its_denials_come_back_as_data(ws, serve, kubernetes):
    root, _ = ws
    policy = root.parent / "policy.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\n[limits]\ntimeout = "1s"\n'
                      'output = "1KiB"\n')
    sandbox = direct(serve("--policy", str(policy)), kubernetes)
    # a request's own timeout cannot lengthen the policy's
    slow = sandbox.commands.run("sleep 20; echo late", command_timeout=60)
    assert slow.timed_out and slow.exit_code == 124 and "late" not in slow.stdout
    assert "the policy grant that would allow it: limits.timeout" in slow.stderr
    raw = sandbox.connector.send_request("POST", "execute", json={"command": "sleep 20"})
    assert raw.json()["denials"] == [
        {"kind": "limits.timeout", "detail": raw.json()["denials"][0]["detail"],
         "grant": "limits.timeout"}]
    loud = sandbox.connector.send_request("POST", "execute", json={
        "command": "head -c 5000 /dev/zero | tr '\\0' x"}).json()
    assert len(loud["stdout"]) == 1024 and loud["truncated"]
    assert [d["grant"] for d in loud["denials"]] == ["limits.output"]
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.connector.send_request("POST", "execute", json={"command": "true",
                                                                "timeout_seconds": -1})
    assert refusal(raised)[0] == 400 and refusal(raised)[1]["error"] == "usage"


def test_a_full_server_is_a_typed_503_to_the_sdk_and_files_still_answer(ws, serve, kubernetes):
    """Past --max-concurrent the SDK's `commands.run` raises at once (it retries no POST)
    with 503 `busy`, while its file operations answer; a client that hangs up frees the
    slot, its command's tree killed."""
    root, _ = ws
    server = serve("--preset", "workspace-write", "--max-concurrent", "1")
    sandbox = direct(server, kubernetes)
    marker = f"600.{os.getpid()}"
    body = json.dumps({"command": f"sleep {marker}"}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as hung:
        hung.sendall(f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     "Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 60
        while not marked(marker):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        began = time.monotonic()
        with pytest.raises(SandboxRequestError) as raised:
            sandbox.commands.run("touch ran")
        status, body = refusal(raised)
        assert (status, body["error"]) == (503, "busy") and "--max-concurrent" in body["message"]
        assert raised.value.response.headers["Retry-After"] == "1"
        sandbox.files.write("kept.txt", b"kept\n")
        assert sandbox.files.read("kept.txt") == b"kept\n" and sandbox.files.exists("kept.txt")
        assert time.monotonic() - began < 10 and not (root / "ran").exists()
    assert gone(marker, within=10), marked(marker)
    assert sandbox.commands.run("echo again").stdout == "again\n"
    sandbox.close_connection()
