"""One file operation, run *inside* the sandbox as its command (`python -I -S -B fileop.py OP
ROOT PATH`): so the sandbox's own layers (mount view, Landlock, protected names) decide what
it may touch, and this script adds one more rule: the path stays inside the workspace ROOT.

It walks from ROOT one component at a time, never following a symbolic link (openat2's
RESOLVE_BENEATH is not available: the sandbox's seccomp filter answers openat2 with ENOSYS),
so a link the command planted cannot lead a tool call out of the workspace.

OPs: `read` (the file's bytes on stdout; `read ROOT PATH OFFSET COUNT LIMIT`: at most COUNT
bytes from OFFSET, `too_large` if the file holds more than LIMIT), `write` (stdin into the file;
missing parent directories are made), `list` (JSON lines: name, kind, size, mtime), `remove` (a file
or a link), `exists` (`not_found` if the name is not there: it alone is looked up, never its
directory listed).
A failure is one JSON object on stderr, {"error": code, "detail": ...}, and exit status 3.
Standard library only: it runs without Stockade's package on its path."""

import errno
import json
import os
import stat
import sys

FAILED = 3
_CODES = {errno.ENOENT: "not_found", errno.ENOTDIR: "not_a_directory",
          errno.EISDIR: "is_a_directory", errno.EACCES: "permission_denied",
          errno.EPERM: "permission_denied", errno.EROFS: "permission_denied",
          errno.ELOOP: "symlink_refused", errno.EEXIST: "exists",
          errno.ENOSPC: "no_space", errno.EDQUOT: "no_space", errno.EFBIG: "too_large",
          errno.ENAMETOOLONG: "name_too_long",
          errno.ENXIO: "not_a_regular_file"}  # (opening a FIFO with no reader for writing)


class Refused(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code, self.detail = code, detail


def parts(root: str, path: str) -> list[str]:
    """The components of `path` below `root` (an absolute path must lie under it)."""
    if os.path.isabs(path):
        relative = os.path.relpath(os.path.normpath(path), root)
    else:
        relative = os.path.normpath(path)
    if relative == ".":
        return []
    names = relative.split(os.sep)
    if names[0] == ".." or "\0" in relative:
        raise Refused("outside_workspace", f"{path}: outside the workspace {root}")
    return names


# Directories on the way are opened O_PATH: a path descriptor needs no read access to them
# (Landlock grants a root's contents, not its ancestors'), and with O_NOFOLLOW | O_DIRECTORY a
# link among them fails ENOTDIR instead of being followed.
WALK = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def step(directory: int, name: str, shown: str, *, make: bool = False) -> int:
    """Descend into `name` under `directory` without following a link (made if `make`)."""
    flags = WALK
    try:
        return os.open(name, flags, dir_fd=directory)
    except FileNotFoundError:
        if not make:
            raise
        try:
            os.mkdir(name, 0o755, dir_fd=directory)
        except FileExistsError:
            pass  # (made meanwhile: opened below, again without following a link)
        return os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and is_link(directory, name):
            raise Refused("symlink_refused", f"{shown}: a symbolic link") from None
        raise


def is_link(directory: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=directory).st_mode)
    except OSError:
        return False


def parent(root: str, names: list[str], *, make: bool = False) -> int:
    """A descriptor of the directory holding the last of `names` (ROOT for none)."""
    directory = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    for index, name in enumerate(names[:-1]):
        shown = os.path.join(root, *names[:index + 1])
        try:
            inner = step(directory, name, shown, make=make)
        finally:
            os.close(directory)
        directory = inner
    return directory


def opened(directory: int, name: str, shown: str, flags: int, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ELOOP and is_link(directory, name):
            raise Refused("symlink_refused", f"{shown}: a symbolic link") from None
        raise


def read(root: str, path: str, offset: str, count: str, limit: str) -> None:
    names = parts(root, path)
    if not names:
        raise Refused("is_a_directory", f"{root}: a directory")
    directory = parent(root, names)
    shown = os.path.join(root, *names)
    try:
        # O_NONBLOCK: a FIFO planted under the name must not hold the call
        fd = opened(directory, names[-1], shown, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as source:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Refused("is_a_directory", f"{shown}: a directory")
        if not stat.S_ISREG(mode):
            raise Refused("not_a_regular_file", f"{shown}: not a regular file")
        if os.fstat(fd).st_size > int(limit):  # (refused before a byte is sent)
            raise Refused("too_large", f"{shown}: more than {limit} bytes")
        os.set_blocking(fd, True)
        source.seek(int(offset))
        left = int(count)
        while left and (chunk := source.read(min(left, 1 << 16))):
            sys.stdout.buffer.write(chunk)
            left -= len(chunk)


def write(root: str, path: str) -> None:
    names = parts(root, path)
    if not names:
        raise Refused("is_a_directory", f"{root}: a directory")
    data = sys.stdin.buffer.read()
    directory = parent(root, names, make=True)
    shown = os.path.join(root, *names)
    try:
        fd = opened(directory, names[-1], shown,
                    os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK)
    finally:
        os.close(directory)
    with os.fdopen(fd, "wb") as target:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused("not_a_regular_file", f"{shown}: not a regular file")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        target.write(data)


def listing(root: str, path: str) -> None:
    walked = parent(root, parts(root, path) + [""])  # (every name a directory)
    try:
        directory = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=walked)
    finally:
        os.close(walked)
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            kind = ("directory" if stat.S_ISDIR(info.st_mode) else "file"
                    if stat.S_ISREG(info.st_mode) else "symlink"
                    if stat.S_ISLNK(info.st_mode) else "other")
            print(json.dumps({"name": entry.name, "kind": kind, "size": info.st_size,
                              "mtime": info.st_mtime}))
    finally:
        os.close(directory)


def remove(root: str, path: str) -> None:
    names = parts(root, path)
    if not names:
        raise Refused("is_a_directory", f"{root}: a directory")
    directory = parent(root, names)
    try:
        # unlink removes a link itself, never its target; a directory is EISDIR
        os.unlink(names[-1], dir_fd=directory)
    finally:
        os.close(directory)


def exists(root: str, path: str) -> None:
    names = parts(root, path)
    if names:
        directory = parent(root, names)
        try:
            os.lstat(names[-1], dir_fd=directory)  # (a link itself counts)
        finally:
            os.close(directory)


OPERATIONS = {"read": read, "write": write, "list": listing, "remove": remove,
              "exists": exists}
ARGUMENTS = {"read": 5, "write": 2, "list": 2, "remove": 2, "exists": 2}  # (after OP)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in OPERATIONS or len(argv) != 1 + ARGUMENTS[argv[0]]:
        raise Refused("usage", "fileop.py read ROOT PATH OFFSET COUNT LIMIT | "
                               "write|list|remove|exists ROOT PATH")
    op, root, path, *rest = argv
    try:
        OPERATIONS[op](root, path, *rest)
    except OSError as exc:
        code = _CODES.get(exc.errno or 0, "failed")
        raise Refused(code, f"{path}: {os.strerror(exc.errno or 0)}") from None
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Refused as refusal:
        sys.stderr.write(json.dumps({"error": refusal.code, "detail": refusal.detail}))
        sys.exit(FAILED)
