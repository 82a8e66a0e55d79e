"""Per-path locks between launches, made of named kernel objects.

A lock is held while its named mutex exists: whoever creates it holds it, whoever finds it
already there waits. Existence, not mutex ownership, is the lock, so it may be taken on one thread
and dropped on another, and the kernel drops it when its holder dies (the last handle closes).

- `briefly(path)`: around one read-modify-write of a DACL, so two launches never overwrite each
  other's entries;
- `hold(path)`: for the launch's whole lifetime, on each path whose DACL it overrides, so two
  launches never interleave protecting and restoring one DACL; a second launch over the same
  tree waits, then fails with `path_busy`.

Names live in this session's namespace and hash the user's SID with the path (paths compare
without regard to case, as Windows compares names: hostpaths.upcase); an AppContainer cannot
create them (its named objects live in a namespace of its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator

from stockade.errors import SetupError
from stockade.launch.hostpaths import upcase
from stockade.windows import constants as c
from stockade.windows.api import fresh_last_error, last_error, win32

BRIEF_WAIT = 300.0  # seconds: another launch's DACL change may propagate through a large tree
HOLD_WAIT = 60.0  # seconds to wait for another launch over the same tree to settle
_POLL = 0.02


def lock_name(kind: str, user_sid: str, path: str) -> str:
    digest = hashlib.sha256(f"{user_sid}\0{upcase(path)}".encode(
        "utf-8", "surrogatepass")).hexdigest()[:32]
    return f"Local\\stockade-{kind}-{digest}"


@contextlib.contextmanager
def briefly(user_sid: str, path: str) -> Iterator[None]:
    handle = _take(lock_name("acl", user_sid, path), BRIEF_WAIT, path)
    try:
        yield
    finally:
        win32().CloseHandle(handle)


def hold(user_sid: str, path: str, stack: contextlib.ExitStack) -> None:
    """Take the lease on `path`; `stack` releases it (at the launch's settlement)."""
    handle = _take(lock_name("lease", user_sid, path), HOLD_WAIT, path)
    stack.callback(win32().CloseHandle, handle)


def _take(name: str, wait: float, path: str) -> int:
    api = win32()
    deadline = time.monotonic() + wait
    while True:
        fresh_last_error()
        try:
            handle = api.CreateMutexW(None, False, name)
        except OSError:
            handle = None  # another user's object of that name: as busy as ours
        else:
            if last_error() != c.ERROR_ALREADY_EXISTS:
                return handle
            api.CloseHandle(handle)
        if time.monotonic() >= deadline:
            raise SetupError("path_busy", f"{path}: another launch is changing its access "
                             "control; launches over one tree take turns", stage="filesystem")
        time.sleep(_POLL)
