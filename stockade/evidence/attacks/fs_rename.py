"""Rename a protected directory, then each directory above it up to the workspace, and plant a
writable replacement at the protected path: any rename or planted file is an escape."""

import os

from _common import ARGS, attempt, write

workspace, protected = ARGS
path = protected
while path != workspace:
    moved = path + ".moved"
    if attempt(f"rename {path}", lambda p=path, m=moved: os.rename(p, m)):
        attempt(f"plant {protected}/config", lambda: (
            os.makedirs(protected, exist_ok=True), write(os.path.join(protected, "config"))))
    path = os.path.dirname(path)
