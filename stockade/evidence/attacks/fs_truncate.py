"""Truncate read-only files by path, through a read-only descriptor and by opening with O_TRUNC:
a shorter file is an escape."""

import os

from _common import ARGS, attempt

for path in ARGS:
    attempt(f"truncate {path}", lambda p=path: os.truncate(p, 0))
    fd = os.open(path, os.O_RDONLY)
    attempt(f"ftruncate a read-only descriptor of {path}", lambda f=fd: os.ftruncate(f, 0))
    attempt(f"open {path} with O_TRUNC",
            lambda p=path: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)))
