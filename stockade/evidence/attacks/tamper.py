"""Overwrite, append to, truncate, rename and remove each path given (files and
directories, existing or not), and create entries inside the directories: any success is an
escape. With `--read` first, reading a file or listing a directory is one too (unless it
reveals nothing, as a mask does). (Metadata: fs_metadata.py.)
"""

import os

from _common import ARGS, attempt, reveal, write

reading = ARGS[:1] == ["--read"]


def moved_and_back(path):
    """Rename it away (the escape), then back: the attempts after it aim at it again."""
    os.rename(path, path + ".moved")
    os.rename(path + ".moved", path)
    return "renamed"


def actions(path):
    if os.path.isdir(path):
        if reading:
            yield "list", lambda: reveal(path)
        yield "create inside", lambda: write(os.path.join(path, "planted"))
        yield "mkdir inside", lambda: os.mkdir(os.path.join(path, "planted-dir"))
        yield "symlink inside", lambda: os.symlink("/", os.path.join(path, "planted-link"))
        yield "rename", lambda: moved_and_back(path)
        yield "rmdir", lambda: os.rmdir(path)
        return
    if reading:
        yield "read", lambda: reveal(path)
    yield "append", lambda: write(path, mode="ab")
    yield "overwrite", lambda: write(path)
    if os.path.exists(path):  # (truncating what does not exist fails anywhere)
        yield "truncate", lambda: os.truncate(path, 0)
        yield "rename", lambda: moved_and_back(path)
        yield "unlink", lambda: os.unlink(path)


for target in ARGS[reading:]:
    for name, action in list(actions(target)):
        attempt(f"{name} {target}", action)
