"""Only one Windows Sandbox runs per host, so Stockade's boots take turns: a lease (see
stockade/lifecycle/lease.py: `flock` on POSIX, a `msvcrt` lock on Windows, dropped by the kernel
when its holder dies) on `windows-sandbox.lock` in the state directory, held from before the
launch until the sandbox is stopped. A second boot does not wait: it fails at once with
SessionError `busy`, which a daemon reports as it is.

The state directory is the user's own, so the lease serialises this user's Stockade processes;
a sandbox started by another user, or by hand, makes the launch itself fail instead."""

from __future__ import annotations

import os

from stockade.lifecycle import lease, statedir
from stockade.session.errors import SessionError

LOCK_FILE = "windows-sandbox.lock"


class HostLock:
    """A held lease; `release` drops it (idempotent)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def default_path() -> str:
    directory = statedir.state_dir()
    statedir.ensure(directory)
    return os.path.join(directory, LOCK_FILE)


def acquire(path: str) -> HostLock:
    """Take the host's Windows Sandbox lease at `path`, or raise SessionError `busy`."""
    fd = _open(path)
    try:
        lease.acquire(fd, wait=False)
    except BlockingIOError:
        os.close(fd)
        raise SessionError("busy", "another Windows Sandbox of this host is running (only one "
                           "can run at a time)") from None
    except BaseException:
        os.close(fd)
        raise
    return HostLock(fd)


def _open(path: str) -> int:
    """The lock file, created on first use (never through a link)."""
    while True:
        try:
            return lease.open_record(path, os.O_RDWR)
        except FileNotFoundError:
            pass
        try:
            return lease.open_record(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            continue  # another boot created it meanwhile: open theirs
