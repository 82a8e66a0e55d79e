"""Disk fill: write each file given in 64 KiB steps until refused (stopping at the given cap on
our own). The size reached is printed per file."""

import os

from _common import ARGS, attempt, note

cap, paths = int(ARGS[0]), ARGS[1:]
chunk = b"\0" * (64 << 10)


def fill(path):
    with open(path, "wb", buffering=0) as f:
        while f.tell() < cap:
            f.write(chunk)
    return f"{cap >> 20} MiB, the attack's own cap"


for path in paths:
    attempt(f"fill {path}", lambda p=path: fill(p))
    note(f"size of {path}", os.path.getsize(path))
