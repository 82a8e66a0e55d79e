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

import difflib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

OPAQUE = "user.overlay.opaque"
DIFF_LIMIT = 1 << 20  # bytes: a larger file's diff is not shown, only that it changed
Fingerprint = tuple[str, int, int, int, int, int]  # type, mode, size, mtime_ns, ctime_ns, ino


@dataclass(frozen=True)
class Change:
    """One change of one write root: `kind` is "added", "modified" or "deleted"; `rel` its
    path below the root; `type` "file", "dir", "symlink" or "other" (what the run left, or
    for a deletion what was there)."""

    kind: str
    root: str
    rel: str
    type: str
    upper: str = ""  # the entry in the upper layer (not for a deletion)

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.rel)


def type_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def fingerprint(info: os.stat_result) -> Fingerprint:
    """What tells an entry changed: the change time moves on every write, chmod, rename or
    link count change, and no one can set it back."""
    return (type_of(info.st_mode), stat.S_IMODE(info.st_mode), info.st_size,
            info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def baseline(root: str) -> dict[str, Fingerprint]:
    """Every entry below `root` (not following symbolic links), by its path below it."""
    found: dict[str, Fingerprint] = {}
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            found[os.path.normpath(os.path.join(rel_dir, name))] = fingerprint(info)
    return found


def is_whiteout(info: os.stat_result) -> bool:
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def scan(root: str, upper: str, base: dict[str, Fingerprint]) -> list[Change]:
    """The changes to `root` its upper layer `upper` holds, against `base`, parents first."""
    changes: list[Change] = []
    _scan_dir(root, upper, "", base, changes)
    return changes


def _scan_dir(root: str, upper: str, rel_dir: str, base: dict[str, Fingerprint],
              out: list[Change]) -> None:
    here = os.path.join(upper, rel_dir)
    try:
        names = sorted(os.listdir(here))
    except FileNotFoundError:
        return
    for name in names:
        rel = os.path.join(rel_dir, name)
        entry = os.path.join(upper, rel)
        info = os.lstat(entry)
        was = base.get(rel)
        if is_whiteout(info):
            if was is not None:
                out.append(Change("deleted", root, rel, was[0]))
            continue
        kind = type_of(info.st_mode)
        if was is not None and was[0] != kind:
            out.append(Change("deleted", root, rel, was[0]))  # replaced by another type
            was = None
        if kind == "dir":
            if was is None:
                out.append(Change("added", root, rel, "dir", entry))
            elif stat.S_IMODE(info.st_mode) != was[1]:
                out.append(Change("modified", root, rel, "dir", entry))
            if was is not None and _opaque(entry):
                kept = set(os.listdir(entry))
                prefix = rel + "/"
                for gone in sorted(p for p in base if p.startswith(prefix)
                                   and "/" not in p[len(prefix):]
                                   and p[len(prefix):] not in kept):
                    out.append(Change("deleted", root, gone, base[gone][0]))
            _scan_dir(root, upper, rel, base, out)
        elif was is None:
            out.append(Change("added", root, rel, kind, entry))
        elif not same_as_host(entry, os.path.join(root, rel)):
            out.append(Change("modified", root, rel, kind, entry))


def same_as_host(upper_entry: str, host: str) -> bool:
    """Whether the host's entry is what the upper layer's is (type, mode, content or link
    target): a file only copied up (opened for writing, touched) changed nothing."""
    try:
        a, b = os.lstat(upper_entry), os.lstat(host)
    except FileNotFoundError:
        return False
    if type_of(a.st_mode) != type_of(b.st_mode) or \
            stat.S_IMODE(a.st_mode) != stat.S_IMODE(b.st_mode):
        return False
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(upper_entry) == os.readlink(host)
    if stat.S_ISDIR(a.st_mode):
        return True
    if not stat.S_ISREG(a.st_mode) or a.st_size != b.st_size:
        return False
    with _read(upper_entry) as x, _read(host) as y:
        while True:
            chunk = x.read(1 << 16)
            if chunk != y.read(1 << 16):
                return False
            if not chunk:
                return True


def _read(path: str):  # noqa: ANN202 - an open binary file
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.fdopen(fd, "rb")


def diff(change: Change) -> str:
    """A unified diff of `change` (text), or one line saying how it changed."""
    old = None if change.kind == "added" else os.path.join(change.root, change.rel)
    new = None if change.kind == "deleted" else change.upper
    a, b = f"a/{change.rel}", f"b/{change.rel}"
    if change.type == "dir":
        return f"{change.kind} directory {change.rel}\n"
    if change.type == "symlink":
        lines = [f"--- {a if old else '/dev/null'}\n", f"+++ {b if new else '/dev/null'}\n"]
        lines += [f"-> {os.readlink(old)}\n"] if old and os.path.islink(old) else []
        lines += [f"+> {os.readlink(new)}\n"] if new else []
        return "".join(lines)
    old_text, new_text = _text(old), _text(new)
    if old_text is None or new_text is None:
        return f"Binary files {a if old else '/dev/null'} and {b if new else '/dev/null'} differ\n"
    header = _mode_header(old, new)
    body = "".join(difflib.unified_diff(old_text, new_text, a if old else "/dev/null",
                                        b if new else "/dev/null"))
    return header + body


def _mode_header(old: str | None, new: str | None) -> str:
    if old is None or new is None:
        return ""
    try:
        before, after = stat.S_IMODE(os.lstat(old).st_mode), stat.S_IMODE(os.lstat(new).st_mode)
    except FileNotFoundError:
        return ""
    return f"old mode {before:o}\nnew mode {after:o}\n" if before != after else ""


def _text(path: str | None) -> list[str] | None:
    """The lines of the file at `path` ([] for none), or None when it is not text."""
    if path is None:
        return []
    try:
        if os.lstat(path).st_size > DIFF_LIMIT:
            return None
        with _read(path) as f:
            data = f.read(DIFF_LIMIT + 1)
    except FileNotFoundError:
        return []
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def walk_upper(upper: str) -> Iterator[str]:
    """Every path in an upper layer (for the tests' and apply's checks), parents first."""
    for dirpath, dirnames, filenames in os.walk(upper):
        for name in sorted(dirnames + filenames):
            yield os.path.relpath(os.path.join(dirpath, name), upper)
