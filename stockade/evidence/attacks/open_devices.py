"""Open each device given (PATH:MODES, MODES the ways the host lets this user open it: r, w)
after listing what /dev offers: opening any of them is an escape."""

import os

from _common import ARGS, attempt, note

try:
    note("/dev holds", " ".join(sorted(os.listdir("/dev"))))
except OSError as exc:
    note("/dev holds", f"(not listable: {exc.strerror})")
for entry in ARGS:
    device, _, modes = entry.rpartition(":")
    for label, mode, flags in (("read", "r", os.O_RDONLY), ("write", "w", os.O_WRONLY)):
        if mode in modes:
            attempt(f"open {device} for {label}",
                    lambda d=device, f=flags: os.close(os.open(d, f | os.O_NONBLOCK)))
