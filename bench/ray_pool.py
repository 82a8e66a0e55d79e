"""Ray pool benchmark (issue 35 item 5): executions of `true` per second through
`stockade.integrations.ray.SandboxPool` with 1, 2 and 4 actors, against the same number of
plain actors running `subprocess.run(["true"])` unsandboxed, on a local Ray of this machine
(loopback only), in the same run.

    python bench/ray_pool.py [--tasks 400] [--actors 1 2 4]

The pool runs with `max_pending` 1 (its default: one command in flight per actor) and 4
(Ray pipelines the calls; a Workspace runs them in sandboxes of its own); the plain actors get
every task at once (Ray queues them)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # (Ray on loopback only)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import ray  # noqa: E402

from stockade.integrations.ray import SandboxPool  # noqa: E402


class Plain:
    def run(self, argv: list[str]) -> int:
        return subprocess.run(argv).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    # A directory of its own, RAY_TMPDIR too (Ray's address file goes to RAY_TMPDIR/ray,
    # else /tmp/ray, one user's: a rootless run could not write what a root run left there),
    # as tests/integrations/test_ray.py does
    temp = tempfile.mkdtemp(prefix="ray-")
    os.environ["RAY_TMPDIR"] = temp
    os.mkdir(os.path.join(temp, "ray"))
    try:
        rows = run(args)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    print("| actors | SandboxPool, max_pending 1 | SandboxPool, max_pending 4 | "
          "plain subprocess.run |")
    print("| --- | --- | --- | --- |")
    for count, (one, four), unsandboxed in rows:
        print(f"| {count} | {one:.0f} | {four:.0f} | {unsandboxed:.0f} |")
    return 0


def run(args: argparse.Namespace) -> list[tuple[int, list[float], float]]:
    """Each row: actors, the pool's executions/s with max_pending 1 and 4, the plain ones'."""
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             _temp_dir=os.environ["RAY_TMPDIR"])
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for count in args.actors:
            sandboxed = []
            for pending in (1, 4):
                with SandboxPool(count, preset="workspace-write", workspace=directory,
                                 max_pending=pending) as pool:
                    pool.ready()
                    list(pool.map([["true"]] * (count * 8)))  # (warm-up)
                    start = time.perf_counter()
                    assert all(o.exit_code == 0 for o in pool.map([["true"]] * args.tasks))
                    sandboxed.append(args.tasks / (time.perf_counter() - start))
            plain = [ray.remote(Plain).options(num_cpus=0).remote() for _ in range(count)]
            ray.get([actor.run.remote(["true"]) for actor in plain])  # (warm-up)
            start = time.perf_counter()
            done = ray.get([plain[n % count].run.remote(["true"]) for n in range(args.tasks)])
            unsandboxed = args.tasks / (time.perf_counter() - start)
            assert done == [0] * args.tasks
            for actor in plain:
                ray.kill(actor)
            rows.append((count, sandboxed, unsandboxed))
    ray.shutdown()
    return rows


if __name__ == "__main__":
    sys.exit(main())
