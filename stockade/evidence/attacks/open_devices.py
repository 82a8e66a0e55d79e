"""Open each device given for reading and for writing, after listing what /dev offers:
opening any of them is an escape."""

import os

from _common import ARGS, attempt, note

note("/dev holds", " ".join(sorted(os.listdir("/dev"))))
for device in ARGS:
    for label, flags in (("read", os.O_RDONLY), ("write", os.O_WRONLY)):
        attempt(f"open {device} for {label}", lambda d=device, f=flags: os.close(os.open(d, f)))
