"""Make protected names in each directory given (each holds `source`, and `dangling`, a
symlink to .envrc): mkdir, open with O_CREAT (also through the dangling symlink), mknod of a
fifo, symlink, hard link and rename of `source` onto the name. Any call that succeeds, or
leaves the name behind, is an escape: a host tool would trust it later.
"""

import os

from _common import ARGS, attempt

NAMES = {"mkdir": ".codex", "open": ".mcp.json", "open through a dangling link": ".envrc",
         "mknod": ".claude", "symlink": ".bashrc", "link": ".gemini", "rename": ".vscode"}


def made(path, call):
    """Run `call`; the name existing afterwards is an escape even if the call said no."""
    try:
        call()
    finally:
        if os.path.lexists(path):
            raise AssertionError  # (reported below, never as a denial)
    return f"made {path}"


def actions(directory):
    def at(how):
        return os.path.join(directory, NAMES[how])
    source = os.path.join(directory, "source")
    yield "mkdir", lambda: os.mkdir(at("mkdir"))
    yield "open", lambda: os.close(os.open(at("open"), os.O_CREAT | os.O_WRONLY, 0o644))
    link = os.path.join(directory, "dangling")
    yield "open through a dangling link", lambda: os.close(os.open(link, os.O_CREAT | os.O_WRONLY,
                                                                   0o644))
    yield "mknod", lambda: os.mknod(at("mknod"), 0o10644)
    yield "symlink", lambda: os.symlink("source", at("symlink"))
    yield "link", lambda: os.link(source, at("link"))
    yield "rename", lambda: os.rename(source, at("rename"))


for directory in ARGS:
    for how, action in list(actions(directory)):
        path = os.path.join(directory, NAMES[how])
        try:
            attempt(f"{how} {path}", lambda path=path, action=action: made(path, action))
        except AssertionError:
            print(f"{how} {path}: ALLOWED the name exists", flush=True)
