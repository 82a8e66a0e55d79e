"""What a Windows launch spends on the filesystem, per-launch grants against standing grants on
the runtime root (issue 31, D10), measured in one run, interleaved, over the model volume of the
tests (tests/test_windows_fakes.py) holding an interpreter tree of realistic size.

    python bench/windows_grants.py [--files N] [--rounds N]

No Windows host is needed, and none is measured: the numbers are the model's work per launch —
entries walked, DACLs written as Windows propagates an inheritable change (the directory and
every file and directory below it, once to grant and once to revert) — and the wall time of
the model itself, for the ratio. A real host's seconds are for the first real run to show.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from test_windows_aceplan import Recorder, no_lock, request, workspace  # noqa: E402
from test_windows_fakes import PACKAGE, USER, FakeTree  # noqa: E402

from stockade.windows import filesystem, standing  # noqa: E402

PY = "C:\\py"


def interpreter(files: int) -> FakeTree:
    """The tests' workspace volume with `files` files below C:\\py, 50 to a directory (a
    CPython install is ~5,000 files; with site-packages, tens of thousands)."""
    tree = workspace()
    for n in range(files):
        directory = f"{PY}\\Lib\\d{n // 50}"
        if tree.key(directory) not in tree.nodes:
            if tree.key(f"{PY}\\Lib") not in tree.nodes:
                tree.add(f"{PY}\\Lib", owner=USER)
            tree.add(directory, owner=USER)
        tree.file(f"{directory}\\m{n}.py", owner=USER)
    return tree


class Counted(FakeTree):
    """Counts the work Windows would do: an entry listed, a DACL written (a write to a
    directory propagates to everything below it, as SetSecurityInfo does)."""

    def __init__(self, tree: FakeTree) -> None:
        super().__init__(nodes=tree.nodes)
        self.walked = self.propagated = 0

    def scan(self, directory: str):
        found = super().scan(directory)
        self.walked += len(found)
        return found

    def write_node(self, node, explicit, protected) -> None:
        super().write_node(node, explicit, protected)
        prefix = node.path.casefold() + "\\"
        self.propagated += 1 + (sum(key.startswith(prefix) for key in self.nodes)
                                if node.is_dir else 0)


def one_launch(tree: Counted, grants: standing.StandingGrants | None) -> float:
    started = time.perf_counter()
    recorder = Recorder(tree)
    req = replace(request(), deny=(), protected=())  # (the runtime root's cost alone)
    filesystem.prepare(req, PACKAGE, recorder, tree, tree, no_lock, lambda path: None,
                       grants, USER)
    recorder.revert_all()  # settlement
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="winC-bench-") as state:
        peers = {"per-launch grant": (Counted(interpreter(args.files)), None),
                 "standing grant": (Counted(interpreter(args.files)),
                                    standing.StandingGrants(state))}
        one_launch(*peers["standing grant"])  # warm-up: the first launch makes the grant
        times: dict[str, list[float]] = {name: [] for name in peers}
        work: dict[str, tuple[int, int]] = {}
        for _ in range(args.rounds):
            for name, (tree, grants) in peers.items():  # interleaved
                tree.walked = tree.propagated = 0
                times[name].append(one_launch(tree, grants))
                work[name] = (tree.walked, tree.propagated)
    print(f"{args.files} files below the runtime root, {args.rounds} launches each, "
          "after the standing grant's first launch")
    print(f"{'':18} {'walked':>8} {'DACLs written':>14} {'model ms':>9}")
    for name in peers:
        walked, written = work[name]
        print(f"{name:18} {walked:8} {written:14} {statistics.median(times[name]) * 1000:9.1f}")
    (a_walk, a_write), (b_walk, b_write) = work.values()
    ratio = statistics.median(times["per-launch grant"]) / statistics.median(
        times["standing grant"])
    print(f"ratio: {(a_walk + a_write) / max(1, b_walk + b_write):.0f}x less work, "
          f"{ratio:.0f}x less model time per launch")


if __name__ == "__main__":
    main()
