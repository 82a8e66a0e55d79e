"""bench/windows_grants.py runs on the fakes it models (it broke once, unnoticed, when the fake
began comparing names as NTFS does): a small tree, one round, and the standing grant walks less."""

from __future__ import annotations

import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                     "windows_grants.py")


def test_the_windows_grants_bench_runs_and_the_standing_grant_walks_less():
    done = subprocess.run([sys.executable, BENCH, "--files", "200", "--rounds", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
            if line.startswith(("per-launch", "standing"))}
    assert int(rows["standing"][2]) < int(rows["per-launch"][2]), done.stdout
