"""Truncate read-only files by path and by opening with O_TRUNC: a shorter file is an escape.
(ftruncate of a read-only descriptor fails anywhere: no attempt.)"""

import os

from _common import ARGS, attempt

for path in ARGS:
    attempt(f"truncate {path}", lambda p=path: os.truncate(p, 0))
    attempt(f"open {path} with O_TRUNC",
            lambda p=path: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)))
