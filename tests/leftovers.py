"""What a run of the suite leaves behind, found and removed at its end (tests/conftest.py).

Processes: every process the suite starts inherits this run's token in its environment
(`TOKEN_VARIABLE`, fresh per run, so two runs at once never see each other's); whatever still
carries it when the run ends (a daemon an example started and forgot, a server a test or an
evidence row left behind, orphaned or not) is a leak: it is killed, listed, and fails the run.
A process started with an environment of its own making does not carry the token; the sandbox's
own processes never do (their environment is the policy's), and end with their owner.

Files: the run's temporary directories (pytest's base temporary directory) are removed
whatever the tests left in them: trees deeper than Python's recursion limit, directories
their owner made unreadable.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

TOKEN_VARIABLE = "STOCKADE_TEST_RUN"


def mark_run() -> str:
    """Give this run a fresh token, which every process it starts from now on inherits."""
    token = secrets.token_hex(16)
    os.environ[TOKEN_VARIABLE] = token
    return token


def carrying(token: str) -> dict[int, str]:
    """Live processes (not this one) whose environment holds `token`: pid -> command line."""
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or another user's
            continue
        if line:  # (a zombie has none: it has ended, its parent has yet to reap it)
            found[int(entry)] = line
    return found


def remove_tree(path: str) -> None:
    """Remove `path` and everything below it. Without recursion and at any depth: each
    directory met is first moved up to be a child of `path` (so no path grows long and no
    more than two directories are open at once); a directory its owner cannot read or search
    is opened to its owner first."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    moved = 0
    try:
        pending = _empty(top)
        while pending:
            name = pending.pop()
            try:
                info = os.stat(name, dir_fd=top, follow_symlinks=False)
                if stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                    os.chmod(name, 0o700, dir_fd=top)  # (a directory: chmod follows no link)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=top)
            except FileNotFoundError:  # (removed meanwhile by whoever else removes it)
                continue
            try:
                for sub in _empty(fd):
                    moved += 1
                    flat = f".removing-{moved}-{secrets.token_hex(4)}"
                    # (moving a directory rewrites its `..`: it must be writable, which an
                    # overlay's work/work, mode 000, is not)
                    mode = stat.S_IMODE(os.stat(sub, dir_fd=fd, follow_symlinks=False).st_mode)
                    if mode & 0o700 != 0o700:
                        os.chmod(sub, 0o700, dir_fd=fd)
                    os.rename(sub, flat, src_dir_fd=fd, dst_dir_fd=top)
                    pending.append(flat)
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)


def _empty(fd: int) -> list[str]:
    """Unlink every entry of the directory open at `fd` but its subdirectories: their names."""
    subdirectories = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return subdirectories
