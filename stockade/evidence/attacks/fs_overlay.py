"""Change everything in a workspace the command may write: overwrite, append to, truncate,
rename, delete and change the mode of its files, remove a directory with its content, and
create files, a directory and a symbolic link; then read it all back. Each change must work
(the workspace is writable) and be seen afterwards, or the attack could show nothing: an
attempt that fails is reported `error`. Where the workspace is an overlay, the host's
workspace must stay as it was (the host checks it); every change is counted in `note
changed`.

Arguments: the workspace, which holds `file`, `append`, `truncate`, `rename`, `remove`,
`mode` and `dir/inner` (setups.overlay_workspace plants them).
"""

import os
import shutil
import sys

from _common import ARGS, note

ws = ARGS[0]
WRITTEN = b"written by a sandboxed attack\n"


def at(name):
    return os.path.join(ws, name)


def overwrite():
    with open(at("file"), "wb") as f:
        f.write(WRITTEN)
    return read("file") == WRITTEN


def append():
    before = read("append")
    with open(at("append"), "ab") as f:
        f.write(WRITTEN)
    return read("append") == before + WRITTEN


def truncate():
    os.truncate(at("truncate"), 0)
    return read("truncate") == b""


def rename():
    os.rename(at("rename"), at("renamed"))
    return not os.path.exists(at("rename")) and os.path.exists(at("renamed"))


def remove():
    os.unlink(at("remove"))
    return not os.path.lexists(at("remove"))


def chmod():
    os.chmod(at("mode"), 0o600)
    return os.stat(at("mode")).st_mode & 0o777 == 0o600


def remove_tree():
    shutil.rmtree(at("dir"))
    return not os.path.lexists(at("dir"))


def create():
    os.mkdir(at("new-dir"))
    with open(at("new-dir/new"), "wb") as f:
        f.write(WRITTEN)
    os.symlink("new-dir/new", at("new-link"))
    return read("new-link") == WRITTEN


def read(name):
    with open(at(name), "rb") as f:
        return f.read()


changed = 0
for action in (overwrite, append, truncate, rename, remove, chmod, remove_tree, create):
    try:
        seen = action()
    except OSError as exc:
        print(f"{action.__name__} in the workspace: error {exc}", flush=True)
        sys.exit(1)
    if not seen:
        print(f"{action.__name__} in the workspace: error not seen afterwards", flush=True)
        sys.exit(1)
    changed += 1
note("changed", f"{changed} changes made and seen in the workspace")
