"""Watch files and directories outside every root with inotify: a watch needs no right to
open what it watches, and would tell the command of the host's activity there (what is
opened, written, made or removed) though it can read none of it.

Arguments: the paths to watch.
"""

import os

from _common import ARGS, attempt, checked, libc

IN_ALL_EVENTS = 0xFFF
IN_CLOEXEC = 0o2000000


def watch(path):
    fd = checked(libc.inotify_init1(IN_CLOEXEC))
    try:
        checked(libc.inotify_add_watch(fd, os.fsencode(path), IN_ALL_EVENTS))
    finally:
        os.close(fd)
    return "watching"


for target in ARGS:
    attempt(f"inotify_add_watch {target}", lambda path=target: watch(path))
