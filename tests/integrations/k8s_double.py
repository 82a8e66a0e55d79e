"""A TEST DOUBLE of the Kubernetes API server, NOT Kubernetes: it serves only the custom-object
calls that `k8s-agent-sandbox`'s claim flow makes (create a SandboxClaim, watch it, read the
Sandbox it is bound to, delete the claim), and plays agent-sandbox's controller as far as the
SDK can see it: a claim on the warm pool it knows is bound at once to a Ready Sandbox whose pod
IP is loopback, where the runtime under test (the real `stockade serve --agent-sandbox`)
listens. A claim on another pool gets the controller's WarmPoolNotFound condition. Every call
is recorded (`calls`), and a call it does not serve is a 404 recorded as such, so a test sees
exactly what the SDK asked of the API."""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxclaims"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes"


class KubernetesDouble(ThreadingHTTPServer):
    """Claims and Sandboxes in memory; `warm_pool` is the one SandboxWarmPool it has."""

    daemon_threads = True

    def __init__(self, warm_pool: str, namespace: str = "default") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.warm_pool, self.namespace = warm_pool, namespace
        self.claims: dict[str, dict] = {}
        self.sandboxes: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path without the query)
        self._version = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> KubernetesDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()

    def version(self) -> str:
        self._version += 1
        return str(self._version)

    def create_claim(self, body: dict) -> dict:
        """The claim as created (no status yet), then bound as the controller would."""
        with self._lock:
            name = body["metadata"]["name"]
            claim = {**body, "metadata": {**body["metadata"], "namespace": self.namespace,
                                          "uid": str(uuid.uuid4()),
                                          "resourceVersion": self.version()}}
            created = json.loads(json.dumps(claim))
            pool = body["spec"]["warmPoolRef"]["name"]
            if pool == self.warm_pool:
                sandbox = f"{pool}-{uuid.uuid4().hex[:5]}"
                self.sandboxes[sandbox] = {
                    "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                    "metadata": {"name": sandbox, "namespace": self.namespace,
                                 "annotations": {"agents.x-k8s.io/pod-name": sandbox}},
                    "status": {"podIPs": [{"ip": "127.0.0.1"}], "conditions": [
                        {"type": "Ready", "status": "True", "reason": "DependenciesReady"}]}}
                claim["status"] = {"sandbox": {"name": sandbox}, "conditions": [
                    {"type": "Ready", "status": "True", "reason": "SandboxReady"}]}
            else:
                claim["status"] = {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "WarmPoolNotFound",
                     "message": f"SandboxWarmPool {pool!r} not found"}]}
            claim["metadata"]["resourceVersion"] = self.version()
            self.claims[name] = claim
            return created


class _Handler(BaseHTTPRequestHandler):
    server: KubernetesDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        path, _ = self._call()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if path != CLAIMS.format(namespace=self.server.namespace):
            return self._send(404, _status(404, "NotFound"))
        if body["metadata"]["name"] in self.server.claims:
            return self._send(409, _status(409, "AlreadyExists"))
        self._send(201, self.server.create_claim(body))

    def do_GET(self) -> None:  # noqa: N802
        path, query = self._call()
        claims, sandboxes = (template.format(namespace=self.server.namespace)
                             for template in (CLAIMS, SANDBOXES))
        if path == claims and query.get("watch") in (["true"], ["True"]):
            name = query["fieldSelector"][0].removeprefix("metadata.name=")
            claim = self.server.claims.get(name)
            events = [{"type": "MODIFIED", "object": claim}] if claim else []
            return self._stream(events)
        store = {claims: self.server.claims, sandboxes: self.server.sandboxes}
        parent, _, name = path.rpartition("/")
        if parent in store and name in store[parent]:
            return self._send(200, store[parent][name])
        self._send(404, _status(404, "NotFound"))

    def do_DELETE(self) -> None:  # noqa: N802
        path, _ = self._call()
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        parent, _, name = path.rpartition("/")
        if parent != CLAIMS.format(namespace=self.server.namespace) or \
                name not in self.server.claims:
            return self._send(404, _status(404, "NotFound"))
        claim = self.server.claims.pop(name)
        bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
        self.server.sandboxes.pop(bound, None)  # (the controller deletes what it made)
        self._send(200, _status(200, "Success"))

    def _call(self) -> tuple[str, dict[str, list[str]]]:
        split = urllib.parse.urlsplit(self.path)
        self.server.calls.append((self.command, split.path))
        return split.path, urllib.parse.parse_qs(split.query)

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[dict]) -> None:
        """A watch: the events, one JSON line each, then the stream ends (as at its
        timeoutSeconds)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(json.dumps(event).encode() + b"\n")
        self.close_connection = True


def _status(code: int, reason: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else
            "Success", "reason": reason, "code": code}
