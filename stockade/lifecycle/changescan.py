"""What an overlaid run changed: its upper layers read against the workspace as it was when
the run started (a baseline: each entry's type, mode, size, times and inode, taken before the
sandbox starts) and as it is now.

In an upper layer (overlayfs with `userxattr`, stockade/linux/overlay.py) a whiteout (a
character device 0:0) is a deletion, a directory with `user.overlay.opaque = "y"` replaced
the one below it whole (what of the lower it held is gone), and any other entry is what the
merged view shows at that path. Nothing here follows a symbolic link: the layers were written
by the sandboxed command.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import BinaryIO

from stockade.lifecycle import treewalk

OPAQUE = "user.overlay.opaque"
Fingerprint = tuple[str, int, int, int, int, int]  # type, mode, size, mtime_ns, ctime_ns, ino


@dataclass(frozen=True)
class Change:
    """One change of one write root: `kind` is "added", "modified", "deleted", or "unshown"
    (something the review cannot show, and so `apply` refuses: `note` says why); `rel` its
    path below the root (`""`: the root itself); `type` "file", "dir", "symlink" or "other"
    (what the run left, or for a deletion what was there); `mode` the mode `apply` gives it
    and `was_mode` the one it had (-1: none); `note` what else to say (a special file's kind,
    what a deleted directory held)."""

    kind: str
    root: str
    rel: str
    type: str
    upper: str = ""  # the entry in the upper layer (not for a deletion)
    mode: int = -1
    was_mode: int = -1
    note: str = ""

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.rel) if self.rel else self.root


def type_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def landed(mode: int) -> int:
    """The permission bits `apply` gives an entry of mode `mode`: never set-user-id or
    set-group-id (the sandbox cannot use one either: its mounts are nosuid)."""
    return stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID)


def special(info: os.stat_result) -> str:
    """What a special file is, in words."""
    if stat.S_ISFIFO(info.st_mode):
        return "a fifo"
    if stat.S_ISSOCK(info.st_mode):
        return "a socket"
    kind = "character" if stat.S_ISCHR(info.st_mode) else "block"
    return f"a {kind} device {os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


def fingerprint(info: os.stat_result) -> Fingerprint:
    """What tells an entry changed: the change time moves on every write, chmod, rename or
    link count change, and no one can set it back."""
    return (type_of(info.st_mode), stat.S_IMODE(info.st_mode), info.st_size,
            info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def baseline(root: str) -> dict[str, Fingerprint]:
    """Every entry below `root` (not following symbolic links), by its path below it, and
    the root itself (`""`). What lies deeper than the walk goes is left out: a change there
    is never shown, so never applied, and a deletion above it conflicts."""
    found = {"": fingerprint(os.lstat(root))}
    for listing in treewalk.walk(root):
        for name, info in listing.entries:
            found[os.path.join(listing.rel, name)] = fingerprint(info)
    return found


def is_whiteout(info: os.stat_result) -> bool:
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def scan(root: str, upper: str, base: dict[str, Fingerprint]) -> list[Change]:
    """The changes to `root` its upper layer `upper` holds, against `base`, parents first:
    one walk, whose result both the review and `apply` use."""
    below: dict[str, list[str]] = {}
    for rel in base:
        if rel:
            below.setdefault(os.path.dirname(rel), []).append(rel)
    out: list[Change] = []
    top = os.lstat(upper)
    # The root's own mode (sets made before the baseline held the root: the host's now).
    was_top = base[""][1] if "" in base else stat.S_IMODE(os.lstat(root).st_mode)
    if landed(top.st_mode) != landed(was_top):
        out.append(Change("modified", root, "", "dir", upper, landed(top.st_mode), was_top))
    hiding: set[str] = set()  # directories in which nothing of the lower layer shows
    for listing in treewalk.walk(upper):
        if listing.problem:
            out.append(Change("unshown", root, listing.rel, "dir", note=listing.problem))
            continue
        if listing.rel in hiding:
            kept = {name for name, _ in listing.entries}
            for gone in sorted(below.get(listing.rel, ())):
                if os.path.basename(gone) not in kept:
                    out.append(_deleted(root, gone, base, below))
        for name, info in listing.entries:
            _scan_entry(root, upper, os.path.join(listing.rel, name), info, base, below,
                        hiding, out)
    return out


def _scan_entry(root: str, upper: str, rel: str, info: os.stat_result,
                base: dict[str, Fingerprint], below: dict[str, list[str]], hiding: set[str],
                out: list[Change]) -> None:
    entry = os.path.join(upper, rel)
    was = base.get(rel)
    if is_whiteout(info):
        if was is not None:
            out.append(_deleted(root, rel, base, below))
        return
    if treewalk.too_long(entry) or treewalk.too_long(os.path.join(root, rel)):
        out.append(Change("unshown", root, rel, type_of(info.st_mode),
                          note="its path is too long to open"))
        return
    kind = type_of(info.st_mode)
    if was is not None and was[0] != kind:
        out.append(_deleted(root, rel, base, below))  # replaced by another type
        was = None
    mode, was_mode = landed(info.st_mode), (was[1] if was is not None else -1)
    note = special(info) if kind == "other" else ""
    if kind == "dir":
        if was is not None and (os.path.dirname(rel) in hiding or _opaque(entry)):
            hiding.add(rel)  # (the lower directory's entries are gone, unless the upper has them)
        if was is None:
            out.append(Change("added", root, rel, "dir", entry, mode))
        elif mode != landed(was_mode):
            out.append(Change("modified", root, rel, "dir", entry, mode, was_mode))
        return
    if kind == "file" and not _readable(entry):
        out.append(Change("unshown", root, rel, kind, note="a file that cannot be read"))
    elif was is None:
        out.append(Change("added", root, rel, kind, entry, mode, note=note))
    elif not same_as_host(entry, os.path.join(root, rel)):
        out.append(Change("modified", root, rel, kind, entry, mode, was_mode, note))


def _deleted(root: str, rel: str, base: dict[str, Fingerprint],
             below: dict[str, list[str]]) -> Change:
    """The deletion of `rel`: a directory's says how many entries it held."""
    was = base[rel]
    note = ""
    if was[0] == "dir":
        held, pending = 0, [rel]
        while pending:
            inner = below.get(pending.pop(), ())
            held += len(inner)
            pending.extend(inner)
        note = f"with the {held} entries below it" if held else ""
    return Change("deleted", root, rel, was[0], was_mode=was[1], note=note)


def same_as_host(upper_entry: str, host: str) -> bool:
    """Whether the host's entry is what the upper layer's is (type, mode as applied, content
    or link target): a file only copied up (opened for writing, touched) changed nothing."""
    try:
        a, b = os.lstat(upper_entry), os.lstat(host)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if type_of(a.st_mode) != type_of(b.st_mode) or landed(a.st_mode) != stat.S_IMODE(b.st_mode):
        return False
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(upper_entry) == os.readlink(host)
    if stat.S_ISDIR(a.st_mode):
        return True
    if not stat.S_ISREG(a.st_mode) or a.st_size != b.st_size:
        return False
    try:
        with read_regular(upper_entry) as x, read_regular(host) as y:
            while True:
                chunk = x.read(1 << 16)
                if chunk != y.read(1 << 16):
                    return False
                if not chunk:
                    return True
    except OSError:
        return False


def read_regular(path: str) -> BinaryIO:
    """The regular file at `path`, open for reading: never a link followed, and never a fifo
    or a device opened (looked at through an O_PATH descriptor first, then reopened)."""
    held = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(held).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        fd = os.open(f"/proc/self/fd/{held}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(held)
    return os.fdopen(fd, "rb")


def _readable(path: str) -> bool:
    try:
        read_regular(path).close()
        return True
    except OSError:
        return False
