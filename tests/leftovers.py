"""What a run of the suite leaves behind, found and removed at its end (tests/conftest.py).

Processes: every process the suite starts inherits this run's token in its environment
(`TOKEN_VARIABLE`, fresh per run, so two runs at once never see each other's); whatever still
carries it when the run ends (a daemon an example started and forgot, a server a test or an
evidence row left behind, orphaned or not) is a leak: it is killed, listed, and fails the run.
A process started with an environment of its own making does not carry the token; the sandbox's
own processes never do (their environment is the policy's), and end with their owner.

Files: the run's temporary directories (pytest's base temporary directory) are removed
whatever the tests left in them (trees deeper than Python's recursion limit, directories
their owner made unreadable or read-only) by Stockade's own treewalk.remove.
"""

from __future__ import annotations

import os
import secrets

TOKEN_VARIABLE = "STOCKADE_TEST_RUN"


def mark_run() -> str:
    """Give this run a fresh token, which every process it starts from now on inherits."""
    token = secrets.token_hex(16)
    os.environ[TOKEN_VARIABLE] = token
    return token


def carrying(token: str) -> dict[int, str]:
    """Live processes (not this one) whose environment holds `token`: pid -> command line."""
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or another user's
            continue
        if line:  # (a zombie has none: it has ended, its parent has yet to reap it)
            found[int(entry)] = line
    return found
