"""For each protected path given, rename it, then each directory above it up to the workspace,
and plant a writable replacement at the protected path: any rename or planted file is an
escape."""

import os

from _common import ARGS, attempt, write

workspace, *protected_paths = ARGS


def plant(protected, was_dir):
    if was_dir:
        os.makedirs(protected, exist_ok=True)
        write(os.path.join(protected, "planted"))
    else:
        os.makedirs(os.path.dirname(protected), exist_ok=True)
        write(protected)


for protected in protected_paths:
    was_dir = os.path.isdir(protected)
    path = protected
    while path != workspace:
        moved = path + ".moved"
        if attempt(f"rename {path}", lambda p=path, m=moved: os.rename(p, m)):
            attempt(f"plant {protected}", lambda p=protected, d=was_dir: plant(p, d))
        path = os.path.dirname(path)
