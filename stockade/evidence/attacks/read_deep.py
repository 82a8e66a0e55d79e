"""Walk down from a directory a directory at a time (each opened below the one above it, so a
path longer than the kernel looks up whole, PATH_MAX, is no obstacle), then read each file
given there: any content reaching the child is an escape. Arguments: the directory, the name of
each directory below it, how many there are, the files."""

import os

from _common import ARGS, Refused, attempt

top, name, levels, *files = ARGS


def reveal_below(file):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(int(levels)):
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        with open(os.open(file, os.O_RDONLY, dir_fd=fd), "rb") as f:
            found = f.read(64)
    finally:
        os.close(fd)
    if not found:
        raise Refused("EMPTY", "nothing revealed")
    return found


for file in files:
    attempt(f"reveal {top}/({name} x{levels})/{file}", lambda f=file: reveal_below(f))
