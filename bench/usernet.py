"""network "any" benchmark: connection set-up and a bulk download through the sandbox's way out
(pasta and the destination guard) against the same made directly, in a small internet of the
test's own (tests/networld.py: nothing leaves this machine), root or rootless.

    python bench/usernet.py [--mib 256] [--rounds 5] [--connections 200]

Each round runs the same client twice, directly in the world's host namespace and inside a
sandbox of network "any" (`stockade run`), one after the other, so load from elsewhere on the
machine hits both sides of a pair; the figures are medians over the rounds. A connection is
connect, one short answer, close; the sandbox's launch is not counted in either figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = os.path.join(REPO, "tests", "networld.py")
PUBLIC, PORT, BULK = "203.0.113.10", 80, 19
SYSTEM_PYTHON = "/usr/bin/python3"  # the sandboxed client's (inside the preset's read roots)
CLIENT = r"""
import json, socket, statistics, sys, time
host, port, bulk, mib, connections = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
setups = []
for _ in range(connections):
    start = time.perf_counter()
    with socket.create_connection((host, port)) as c:
        c.recv(100)
    setups.append(time.perf_counter() - start)
size = mib << 20
start = time.perf_counter()
with socket.create_connection((host, bulk)) as c:
    c.sendall(size.to_bytes(8, "big"))
    got = 0
    while got < size:
        data = c.recv(1 << 20)
        if not data:
            break
        got += len(data)
seconds = time.perf_counter() - start
print(json.dumps({"connect_ms": statistics.median(setups) * 1000,
                  "mib_s": got / (1 << 20) / seconds, "bytes": got}))
"""
POLICY = '{"version": 1, "preset": "read-only", "network": {"mode": "any"}}'


def inside(args: argparse.Namespace) -> None:
    """In the world: the rounds, each direct then sandboxed; prints the figures as JSON."""
    work = tempfile.mkdtemp(prefix="bench-usernet-")
    policy = os.path.join(work, "policy.json")
    with open(policy, "w") as f:
        f.write(POLICY)
    client = [SYSTEM_PYTHON, "-c", CLIENT, PUBLIC, str(PORT), str(BULK), str(args.mib),
              str(args.connections)]
    stockade = [sys.executable, "-m", "stockade", "run", "--policy", policy, "--"]
    rounds: dict[str, list[dict]] = {"direct": [], "sandboxed": []}
    for _ in range(args.rounds):
        for name, argv in (("direct", client), ("sandboxed", stockade + client)):
            done = subprocess.run(argv, capture_output=True, text=True, cwd=work, check=False)
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr.strip()}")
            rounds[name].append(json.loads(done.stdout.splitlines()[-1]))
    os.remove(policy)
    os.rmdir(work)
    print(json.dumps({name: {key: statistics.median(r[key] for r in found)
                             for key in ("connect_ms", "mib_s")}
                      for name, found in rounds.items()}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return 0
    spec = {"argv": [sys.executable, os.path.abspath(__file__), "--inside", "--mib",
                     str(args.mib), "--rounds", str(args.rounds), "--connections",
                     str(args.connections)], "timeout": 1800}
    done = subprocess.run([sys.executable, WORLD, json.dumps(spec)], capture_output=True,
                          text=True, check=False)
    if done.returncode:
        print(done.stderr, file=sys.stderr)
        return 1
    world = json.loads(done.stdout)
    if world["returncode"]:
        print(world["stderr"], file=sys.stderr)
        return 1
    found = json.loads(world["stdout"].splitlines()[-1])
    direct, sandboxed = found["direct"], found["sandboxed"]
    print(f"{'':24}{'direct':>12}{'network any':>14}{'ratio':>8}")
    print(f"{'connection (ms, median)':24}{direct['connect_ms']:>12.3f}"
          f"{sandboxed['connect_ms']:>14.3f}"
          f"{sandboxed['connect_ms'] / direct['connect_ms']:>8.2f}")
    print(f"{f'{args.mib} MiB download (MiB/s)':24}{direct['mib_s']:>12.0f}"
          f"{sandboxed['mib_s']:>14.0f}{sandboxed['mib_s'] / direct['mib_s']:>8.2f}")
    print(f"added per connection: {sandboxed['connect_ms'] - direct['connect_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
