"""The CLI server a `stockade run` starts by itself when none answers (stockade/program.py), so
that the command lines after it start in a fraction of the time (docs/performance.md).

It is the server `stockade daemon` runs (stockade/cli/server.py) with three differences: it
serves only clients in the cgroup it was started in, besides their user, namespaces, root,
confinement, groups and resource limits (stockade/linux/peer.py), since its runs take its
cgroup; it ends by itself after `STOCKADE_SERVER_IDLE` seconds with no request (default
IDLE_DEFAULT; "0" means no server is started at all); and it holds nothing of the run that
started it — no standard stream, no working directory in a workspace.

Started as `python -P -m stockade.cli.autoserver` with the caller's environment: `-P` keeps
the caller's working directory (perhaps a workspace a sandbox wrote) off the import path.
"""

from __future__ import annotations

import os
import sys

IDLE_ENV = "STOCKADE_SERVER_IDLE"
IDLE_DEFAULT = 600.0  # seconds


def idle_seconds(env: dict[str, str]) -> float | None:
    """How long a started server waits for its next request; None: start none ("0", or a
    value that is not a number of seconds)."""
    try:
        seconds = float(env.get(IDLE_ENV, IDLE_DEFAULT))
    except ValueError:
        return None
    return seconds if 0 < seconds < float("inf") else None


def start_in_background() -> None:
    """Start a server for the next command lines of this user in this context, detached (a
    session of its own, /dev/null for its streams); nothing is waited for, and a failure to
    start one changes nothing but the next run's speed."""
    if idle_seconds(dict(os.environ)) is None:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-P", "-m", __name__], os.environ,
                       file_actions=[(os.POSIX_SPAWN_DUP2, null, fd) for fd in (0, 1, 2)],
                       setsid=True)
    except OSError:
        pass
    finally:
        os.close(null)


def main() -> int:
    os.chdir("/")
    idle = idle_seconds(dict(os.environ))
    if idle is None:
        return 0
    from stockade.cli import COMMAND_LINE, server
    from stockade.cliwire import socket_path
    from stockade.errors import StockadeError
    from stockade.linux import peer, servercheck

    try:
        path = socket_path()
    except (StockadeError, OSError, RuntimeError):
        return 70  # (no state directory to be had: every run goes on cold, and says why)
    try:
        if servercheck.answers(path):
            return 0  # another run started one first
    except servercheck.ServerUntrusted:
        pass  # (replaced, as `stockade daemon` replaces it: see server._bind)
    try:
        server.serve(path, COMMAND_LINE, idle=idle, context=peer.STARTED_CONTEXT)
    except (StockadeError, OSError):
        return 70  # (the state directory cannot hold a socket: every run goes on cold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
