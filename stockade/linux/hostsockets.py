"""The host's listening unix sockets that lie in a granted root (issue 29 part 7).

A read-only mount does not stop connect() on a socket file, and Landlock (up to ABI 7) does
not govern it, so with `network.unix_sockets = "own"` every host socket a root holds is masked
like a denied path. Walking every read root (`/` itself) for socket files at each launch would
be slow; the kernel already lists every bound pathname socket of a network namespace in its
/proc/net/unix. The owner's namespace is the one the host's daemons listen in: the sandbox's
init reads its parent's list (its own namespace is empty), the owner its own, so both surveys
of a view (mnt.identity_now and mnt.build) find the same sockets. A listed path may pass
through symbolic links (bound as /var/run/x.sock, /var/run a link to /run): the mask goes on
the socket's real place (`real`).

What this does not see, said in SECURITY.md: a socket bound after the launch, one bound in
another network namespace (a container's), one bound by a path that names another file here
(a relative path, another mount namespace's view), and one renamed or linked to another name
since its bind (the list keeps the bind-time name; no list has the current one).
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
    """The socket files listed in `listing` whose real place (`real`) lies in one of `roots`,
    but not below `own` (the sandbox's own filesystems, which cover the host's), in sorted
    order, each by that real path."""
    roots, own = list(roots), list(own)
    found = set()
    for listed in bound(listing):
        path = real(listed)
        if path is None:
            continue
        covering = max((r for r in roots if _below(path, r)), key=len, default=None)
        if covering is None or any(_below(path, o) and len(o) > len(covering) for o in own):
            continue
        found.add(path)
    return sorted(found)


def real(path: str) -> str | None:
    """The path of the socket file `path` names with no symbolic link on the way (a socket
    bound as /var/run/x.sock, /var/run a link to /run, is /run/x.sock): where a mask can go,
    and all it takes: the view holds the same links, so every name of it there leads to that
    place (the bind-time name's links are resolved here, as the sandbox would). None if it
    names no socket file the launching user can reach: gone, a loop, a directory it may not
    search (nor then may the command)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return None
        resolved = os.path.realpath(path, strict=True)
        return resolved if stat.S_ISSOCK(os.stat(resolved, follow_symlinks=False).st_mode) \
            else None
    except OSError:
        return None


def _below(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")
