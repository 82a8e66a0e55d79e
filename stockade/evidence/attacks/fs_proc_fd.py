"""Open a read-only file read-only, then reopen it writable through /proc/self/fd and /dev/fd:
a writable descriptor is an escape."""

import os

from _common import ARGS, attempt

for path in ARGS:
    fd = os.open(path, os.O_RDONLY)
    for alias in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}"):
        for label, flags in (("write", os.O_WRONLY), ("read-write", os.O_RDWR),
                             ("append", os.O_WRONLY | os.O_APPEND)):
            attempt(f"reopen {alias} ({path}) for {label}",
                    lambda a=alias, f=flags: os.write(os.open(a, f), b"reopened\n"))
