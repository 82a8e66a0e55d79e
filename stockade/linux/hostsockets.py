"""The host's listening unix sockets that lie in a granted root (issue 29 part 7).

A read-only mount does not stop connect() on a socket file, and Landlock (up to ABI 7) does
not govern it, so with `network.unix_sockets = "own"` every host socket a root holds is masked
like a denied path. Walking every read root (`/` itself) for socket files at each launch would
be slow; the kernel already lists every bound pathname socket of a network namespace in its
/proc/net/unix. The owner's namespace is the one the host's daemons listen in: the sandbox's
init reads its parent's list (its own namespace is empty), the owner its own, so both surveys
of a view (mnt.identity_now and mnt.build) find the same sockets.

What this does not see, said in SECURITY.md: a socket bound after the launch, one bound in
another network namespace (a container's), and one bound by a path that names another file
here (a relative path, another mount namespace's view).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

OWN = "/proc/self/net/unix"


def parents_listing() -> str:
    """The /proc/net/unix of this process's parent (by the host's procfs, still mounted at
    /proc while the view is built)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return f"/proc/{int(fields[1])}/net/unix"


def bound(listing: str) -> set[str]:
    """The paths of the pathname sockets in `listing` (a /proc/net/unix)."""
    with open(listing, "rb") as f:
        lines = f.read().splitlines()[1:]
    paths = set()
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith(b"/"):
            paths.add(os.fsdecode(fields[7]))
    return paths


def in_roots(listing: str, roots: Iterable[str], own: Iterable[str]) -> list[str]:
    """The socket files listed in `listing` that lie in one of `roots`, but not below `own`
    (the sandbox's own filesystems, which cover the host's), in sorted order."""
    roots, own = list(roots), list(own)
    found = []
    for path in sorted(bound(listing)):
        covering = max((r for r in roots if _below(path, r)), key=len, default=None)
        if covering is None or any(_below(path, o) and len(o) > len(covering) for o in own):
            continue
        try:
            if stat.S_ISSOCK(os.stat(path, follow_symlinks=False).st_mode):
                found.append(path)
        except OSError:
            continue  # (gone, or not reachable by this name: nothing to mask)
    return found


def _below(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")
