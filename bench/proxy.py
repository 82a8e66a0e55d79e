"""Egress proxy benchmark: a 256 MiB transfer and connection set-up through Stockade's proxy
against the same directly, all on loopback, each party in its own process.

    python bench/proxy.py [--mib 256] [--rounds 7] [--connections 200] [--cpus 0]

Targets (issue 4): at least 0.8 of direct throughput; at most 1 ms added per connection.
Transfers run in rounds, direct then proxied, after one warm-up each; the ratio reported is the
median of the rounds' ratios, so load from elsewhere on the machine hits both sides of a pair.
The proxy runs in a process of its own, as `stockade proxy`. Run by a library caller it shares
that caller's process: the last lines measure it there with a thread busy in Python code, for
the C relay (stockade/linux/relay.c) and for the Python relay it stands in for.
Where /proc exists, CPU seconds per GiB of each process say where a proxied byte's cost goes,
and the machine's busy cores during the transfers say how much of it ran in parallel.
`--cpus 0` puts every party on CPU 0: the ratio is then that of the two paths' CPU costs.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAY_LIBRARY = os.path.join(REPO, "stockade", "linux", "librelay.so")  # (see setup.py)
CHUNK = 1 << 20
# A sender: each connection gets `size` bytes (0: just accept and close), forever.
UPSTREAM = """
import socket, sys
size = int(sys.argv[1]); chunk = b"x" * (1 << 20)
server = socket.create_server(("127.0.0.1", 0)); print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        left = size
        while left > 0:
            conn.sendall(chunk[:min(left, len(chunk))]); left -= len(chunk)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_upstream(size: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(size)], stdout=subprocess.PIPE,
                            text=True)
    return proc, int(proc.stdout.readline())


# `stockade proxy` in a process that may also keep a thread busy in Python code, and may relay
# in Python where the C relay is built.
PROXY = """
import runpy, sys, threading
busy, relay = sys.argv.pop(1), sys.argv.pop(1)
if relay == "python":
    import stockade.net.relay
    stockade.net.relay.compiled_relay = lambda: None
if busy == "busy":
    def spin():
        while True:
            pass
    threading.Thread(target=spin, daemon=True).start()
runpy.run_module("stockade", run_name="__main__")
"""


def _start_proxy(upstream_ports: list[int], busy: bool = False, relay: str = "default"
                 ) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    allow = [arg for p in upstream_ports for arg in ("--allow", f"127.0.0.1:{p}")]
    proc = subprocess.Popen([sys.executable, "-c", PROXY, "busy" if busy else "idle", relay,
                             "proxy", *allow, "--listen", f"127.0.0.1:{port}", "--log",
                             os.devnull],
                            env={**os.environ, "PYTHONPATH": REPO}, stderr=subprocess.PIPE,
                            text=True)
    proc.stderr.readline()  # "proxy on ..." once it listens
    return proc, port


def _connect(port: int, via: int | None) -> socket.socket:
    """A connection to the upstream on `port`, directly or through a CONNECT tunnel."""
    sock = socket.create_connection(("127.0.0.1", via or port))
    if via:
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"proxy refused: {head!r}")
    return sock


def throughput(port: int, via: int | None, size: int) -> float:
    """MiB/s receiving `size` bytes."""
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    with _connect(port, via) as sock:
        got = 0
        while got < size:
            n = sock.recv_into(buffer)
            if not n:
                break
            got += n
    return got / (time.perf_counter() - started) / 2**20


def cpu_seconds(pid: int | None) -> float:
    """User plus system time of process `pid` (None: this one); NaN without /proc."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far; (0, 0) without /proc."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def setup_latency(port: int, via: int | None, count: int) -> float:
    """Median milliseconds to an open (tunnelled) connection."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        with _connect(port, via):
            samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def busy_owner(bulk_port: int, size: int, rounds: int) -> list[str]:
    """The transfer through a proxy whose process has a thread busy in Python, with each
    relay, against direct measured in the same rounds (the busy thread takes a core from
    both): a line each."""
    lines = []
    for relay in ("default", "python"):
        proxy, proxy_port = _start_proxy([bulk_port], busy=True, relay=relay)
        try:
            pairs = [(throughput(bulk_port, None, size), throughput(bulk_port, proxy_port, size))
                     for _ in range(rounds)]
        finally:
            proxy.terminate()
            proxy.wait()
        name = "Python relay" if relay == "python" else "C relay" \
            if os.path.exists(RELAY_LIBRARY) else "Python relay (the C relay is not built)"
        lines.append(f"owner busy in Python, {name}: direct "
                     f"{statistics.median(d for d, _ in pairs):.0f} MiB/s, proxy "
                     f"{statistics.median(p for _, p in pairs):.0f} MiB/s, ratio "
                     f"{statistics.median(p / d for d, p in pairs):.2f} ({rounds} rounds)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--cpus", help="comma-separated CPUs to keep every party on")
    args = parser.parse_args()
    if args.cpus:  # the children inherit it
        try:
            os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
        except (ValueError, OSError) as error:
            parser.error(f"--cpus {args.cpus}: {error}")
    cores = os.cpu_count() or 1
    size = args.mib << 20
    bulk, bulk_port = _start_upstream(size)
    empty, empty_port = _start_upstream(0)
    proxy, proxy_port = _start_proxy([bulk_port, empty_port])
    parties = {"client": None, "upstream": bulk.pid, "proxy": proxy.pid}
    rates: dict[str, list[float]] = {"direct": [], "proxy": []}
    cpu = {way: dict.fromkeys(parties, 0.0) for way in rates}
    busy: dict[str, list[float]] = {way: [] for way in rates}
    try:
        for via in (None, proxy_port):  # warm-up
            throughput(bulk_port, via, size)
        for _ in range(args.rounds):
            for way, via in (("direct", None), ("proxy", proxy_port)):
                before = {name: cpu_seconds(pid) for name, pid in parties.items()}
                machine_before = busy_jiffies()
                rates[way].append(throughput(bulk_port, via, size))
                machine_after = busy_jiffies()
                machine_total = machine_after[1] - machine_before[1]
                if machine_total:
                    machine_busy = machine_after[0] - machine_before[0]
                    busy[way].append(cores * machine_busy / machine_total)
                for name, pid in parties.items():
                    cpu[way][name] += cpu_seconds(pid) - before[name]
        direct_ms = setup_latency(empty_port, None, args.connections)
        proxy_ms = setup_latency(empty_port, proxy_port, args.connections)
        busy_lines = busy_owner(bulk_port, size, max(1, args.rounds // 2))
    finally:
        for proc in (proxy, bulk, empty):
            proc.terminate()
            proc.wait()
    direct_rate = statistics.median(rates["direct"])
    proxy_rate = statistics.median(rates["proxy"])
    pairs = zip(rates["direct"], rates["proxy"], strict=True)
    ratio = statistics.median(proxied / direct for direct, proxied in pairs)
    print(f"{args.mib} MiB transfer, {args.rounds} rounds: direct {direct_rate:.0f} MiB/s, "
          f"proxy {proxy_rate:.0f} MiB/s (medians), ratio {ratio:.2f} (median of rounds; "
          f"target >= 0.80)")
    for way in rates:
        runs = " ".join(f"{rate:.0f}" for rate in rates[way])
        gib = args.rounds * size / 2**30
        shares = ", ".join(f"{name} {seconds / gib:.2f}" for name, seconds in cpu[way].items()
                           if seconds)
        cores_busy = (f"; machine busy {statistics.median(busy[way]):.2f} of {cores} cores"
                      if busy[way] else "")
        print(f"  {way}: runs {runs} MiB/s; CPU s/GiB: {shares}{cores_busy}")
    print(f"connection set-up (median of {args.connections}): direct {direct_ms:.3f} ms, proxy "
          f"{proxy_ms:.3f} ms, added {proxy_ms - direct_ms:.3f} ms (target <= 1 ms)")
    print("\n".join(busy_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
