"""On a case-folding filesystem, append to and truncate protected and denied names spelled
another way (`.GIT/config` for `.git/config`). The first argument is the workspace's `.git`,
which must be there: a sandbox seeing another filesystem than the host's is itself a failure.
A write that lands is an escape."""

import os

from _common import ARGS, attempt, write

expected, aliases = ARGS[0], ARGS[1:]
if not os.path.isdir(expected):
    print(f"see the host's workspace: ALLOWED a stale view without {expected}", flush=True)
for path in aliases:
    attempt(f"append {path}", lambda p=path: write(p, mode="ab"))
    attempt(f"truncate {path}", lambda p=path: os.truncate(p, 0))
