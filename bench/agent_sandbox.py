"""`stockade serve --agent-sandbox` benchmark (issue 35 item 5): `true` through `POST /execute`
(one keep-alive connection per client, as the SDK's pooled session) against the same command
through Stockade's API in this process (a Workspace over the same directory and preset:
the warm sandbox without HTTP), in the same run.

    python bench/agent_sandbox.py [--requests 200] [--rounds 3] [--clients 1 4]

Each round runs every contender one after the other, so load from elsewhere on the machine
hits both; the figures are medians over the rounds of each round's requests/s, p50 and p99.
Both run `/bin/sh -c true` (the server runs a command string by the shell)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from stockade.integrations.workspace import Workspace  # noqa: E402


def measure(call: Callable[[], Callable[[], None]], requests: int, clients: int) -> dict:
    """`clients` threads, each making its own caller with `call()` and calling it
    `requests // clients` times; requests/s overall, p50 and p99 of one call (ms)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        once, own = call(), []
        for _ in range(requests // clients):
            start = time.perf_counter()
            once()
            own.append(time.perf_counter() - start)
        with lock:
            latencies.extend(own)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {"rps": len(latencies) / elapsed,
            "p50": latencies[len(latencies) // 2] * 1000,
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000}


def over_http(port: int) -> Callable[[], None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"command": "true"}).encode()

    def once() -> None:
        connection.request("POST", "/execute", body=body,
                           headers={"Content-Type": "application/json"})
        answer = json.loads(connection.getresponse().read())
        assert answer["exit_code"] == 0, answer
    return once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        log = open(os.path.join(directory, "server.log"), "w+")  # noqa: SIM115
        root = os.path.join(directory, "ws")
        os.mkdir(root)
        server = subprocess.Popen(
            [sys.executable, "-m", "stockade", "serve", "--agent-sandbox", "--port", "0",
             "--preset", "workspace-write", "--workspace", root],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        while "serving" not in (said := open(log.name).read()):
            assert server.poll() is None, said
            time.sleep(0.05)
        port = int(said.split("http://127.0.0.1:")[1].split()[0])
        workspace = Workspace(preset="workspace-write", workspace=root)

        def api() -> Callable[[], None]:
            return lambda: workspace.exec("true", shell=True)

        try:
            rows = []
            for clients in args.clients:
                results: dict[str, list[dict]] = {"http": [], "api": []}
                for make in (lambda: over_http(port), api):
                    measure(make, 20, clients)  # (warm-up: every client's sandbox started)
                for _ in range(args.rounds):
                    results["http"].append(measure(lambda: over_http(port), args.requests,
                                                   clients))
                    results["api"].append(measure(api, args.requests, clients))
                for contender, rounds in results.items():
                    rows.append((contender, clients, *(statistics.median(r[key] for r in rounds)
                                                       for key in ("rps", "p50", "p99"))))
        finally:
            workspace.close()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    print("| contender | clients | requests/s | p50 (ms) | p99 (ms) |")
    print("| --- | --- | --- | --- | --- |")
    for contender, clients, rps, p50, p99 in rows:
        name = "`POST /execute` (HTTP)" if contender == "http" else "`Workspace.exec` (API)"
        print(f"| {name} | {clients} | {rps:.0f} | {p50:.2f} | {p99:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
