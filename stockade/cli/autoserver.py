"""The CLI server a `stockade run` starts by itself when none answers (stockade/program.py), so
that the command lines after it start in a fraction of the time (docs/performance.md).

It is the server `stockade daemon` runs (stockade/cli/server.py) with three differences: it
serves only clients in the cgroup it was started in, besides their user, namespaces, root,
confinement, groups and resource limits (stockade/linux/peer.py), since its runs take its
cgroup; it ends by itself after `STOCKADE_SERVER_IDLE` seconds with no request (default
IDLE_DEFAULT; "0" means no server is started at all); and it holds nothing of the run that
started it — no standard stream, no working directory in a workspace.

Started as `python -P -m stockade.cli.autoserver` in `/` with the caller's environment and
import flags: neither the caller's working directory (perhaps a workspace a sandbox wrote) nor
a relative PYTHONPATH entry names a directory of it on the server's import path.
"""

from __future__ import annotations

import os
import sys

from stockade.cliwire import IDLE_ENV

IDLE_DEFAULT = 600.0  # seconds
IDLE_MOST = 7 * 86400.0  # a longer idle time is this one
LOCK_NAME = "cli.lock"  # in the state directory: held by the server a run started, for life


def idle_seconds(env: dict[str, str]) -> float | None:
    """How long a started server waits for its next request; None: start none ("0", or a
    value that is not a number of seconds)."""
    try:
        seconds = float(env.get(IDLE_ENV, IDLE_DEFAULT))
    except ValueError:
        return None
    return min(seconds, IDLE_MOST) if seconds > 0 and seconds == seconds else None


def start_in_background() -> None:
    """Start a server for the next command lines of this user in this context, detached (a
    session of its own, in /, /dev/null for its streams, no other descriptor of ours, the
    interpreter's import flags ours); nothing is waited for, and a failure to start one
    changes nothing but the next run's speed. None is started under a tracer (whose trace it
    would join, and whose end it would hold up)."""
    if idle_seconds(dict(os.environ)) is None or _traced():
        return
    import subprocess

    flags = [flag for flag, on in (("-I", sys.flags.isolated), ("-E", sys.flags.ignore_environment),
                                   ("-s", sys.flags.no_user_site), ("-S", sys.flags.no_site)) if on]
    try:
        subprocess.Popen([sys.executable, *flags, "-P", "-m", __name__], cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        pass


def _traced() -> bool:
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"TracerPid:"):
                    return line.split()[1] != b"0"
    except OSError:
        pass
    return False


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
        lock = _lock(os.path.dirname(path))
    except (StockadeError, OSError):
        return 70  # (the state directory cannot hold a socket: every run goes on cold)
    if lock is None:
        return 0  # another run's server is starting or serving
    try:
        if servercheck.answers(path):
            return 0  # (a daemon's)
    except servercheck.ServerUntrusted:
        pass  # (replaced, as `stockade daemon` replaces it: see server._bind)
    try:
        server.serve(path, COMMAND_LINE, idle=idle, context=peer.STARTED_CONTEXT)
    except (StockadeError, OSError):
        return 70
    finally:
        os.close(lock)
    return 0


def _lock(state: str) -> int | None:
    """The lock of the server a run starts (its descriptor, held for this process's life), or
    None when another holds it: first runs ending together start one server, not several
    that would each take the socket from the last."""
    from stockade.lifecycle import lease, statedir

    statedir.ensure(state)
    return lease.held(os.open(os.path.join(state, LOCK_NAME), os.O_RDWR | os.O_CREAT
                              | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))


if __name__ == "__main__":
    sys.exit(main())
