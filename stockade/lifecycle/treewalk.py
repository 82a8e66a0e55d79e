"""Walking and removing trees a sandboxed command may have shaped (an overlay's upper layer, a
workspace it wrote): without recursion, without following a symbolic link, to a bounded
depth, and with what cannot be listed said rather than raised.

A command can make a tree deeper than Python's recursion limit, longer than PATH_MAX, or
leave directories its owner cannot read (mode 000, rootless): the review, `apply` and
`discard` must neither crash nor hang on any of them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

MAX_DEPTH = 256  # levels below the top: a deeper directory is not listed (`Listing.problem`)
PATH_MAX = 4096  # bytes, with the NUL: a longer path cannot be opened by name


@dataclass(frozen=True)
class Listing:
    """One directory `rel` below the top (`""` for the top itself): its entries (name, lstat)
    sorted by name, or why they could not be listed (`problem`)."""

    rel: str
    entries: tuple[tuple[str, os.stat_result], ...] = ()
    problem: str = ""


def too_long(path: str) -> bool:
    return len(os.fsencode(path)) >= PATH_MAX


def walk(top: str) -> Iterator[Listing]:
    """Every directory below `top` (`top` first), parents before their children, each with
    its entries; symbolic links are entries, never followed."""
    pending = [""]
    while pending:
        rel = pending.pop()
        listing = _list(top, rel)
        if listing is None:
            continue  # (gone meanwhile)
        yield listing
        pending.extend(os.path.join(rel, name) for name, info in reversed(listing.entries)
                       if stat.S_ISDIR(info.st_mode))


def _list(top: str, rel: str) -> Listing | None:
    depth = rel.count("/") + 1 if rel else 0
    if depth > MAX_DEPTH:
        return Listing(rel, problem=f"deeper than {MAX_DEPTH} levels")
    here = os.path.join(top, rel) if rel else top
    if too_long(here):
        return Listing(rel, problem="its path is too long to open")
    entries = []
    try:
        with os.scandir(here) as found:
            for entry in found:
                try:
                    entries.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        return Listing(rel, problem="a directory that cannot be read")
    except OSError as exc:
        return Listing(rel, problem=f"a directory that cannot be listed ({exc.strerror})")
    return Listing(rel, tuple(sorted(entries, key=lambda e: e[0])))


def remove(path: str) -> None:
    """Remove `path` whole, however deep (one directory open at a time, walking back up by
    "..", each step checked against the directory it came from), making each directory of its
    own that it cannot list, search or unlink in (mode 000, 0555) 0700 on the way (overlayfs
    leaves mode-000 directories in its work directory; a command can leave any in an upper
    layer, a private home, a workspace)."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return
    parent = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        name = os.path.basename(path)
        if stat.S_ISDIR(top.st_mode):
            _remove_tree(parent, name)
        else:
            os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)


def _remove_tree(top_parent: int, top_name: str) -> None:
    fd = os.dup(top_parent)
    names: list[str] = []                 # the directories walked into, below top_parent
    above: list[tuple[int, int]] = []     # the identity of each one's parent
    name = top_name
    try:
        while True:
            inner = _open_for_removal(fd, name)
            try:
                deeper = _empty_but_directories(inner)
            except BaseException:
                os.close(inner)
                raise
            if deeper is None:
                os.close(inner)
            else:
                here = os.fstat(fd)
                above.append((here.st_dev, here.st_ino))
                names.append(name)
                os.close(fd)
                fd, name = inner, deeper
                continue
            os.rmdir(name, dir_fd=fd)
            if not names:
                return
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            seen = os.fstat(up)
            if (seen.st_dev, seen.st_ino) != above.pop():
                os.close(up)
                raise OSError(errno.ESTALE, "a directory moved while it was being removed",
                              top_name)
            os.close(fd)
            fd, name = up, names.pop()
    finally:
        os.close(fd)


def _open_for_removal(dir_fd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        _chmod_directory(dir_fd, name)
        return os.open(name, flags, dir_fd=dir_fd)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # (its entries are unlinked, and looked at, through it)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _chmod_directory(dir_fd: int, name: str) -> None:
    """chmod 0700 the directory `name` (never a link: opened O_PATH | O_NOFOLLOW first)."""
    held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISDIR(os.fstat(held).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
        os.chmod(f"/proc/self/fd/{held}", 0o700)
    finally:
        os.close(held)


def _empty_but_directories(fd: int) -> str | None:
    """Unlink every entry of the directory open at `fd` but directories; the first directory
    left, if any."""
    for name in os.listdir(fd):
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return name
        os.unlink(name, dir_fd=fd)
    return None
