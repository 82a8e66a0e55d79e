"""Memory bomb: allocate and touch memory in 16 MiB steps until refused (stopping at the given
cap on our own). The amount reached is printed."""

import errno

from _common import ARGS, attempt, note

cap = int(ARGS[0])
step = 16 << 20
held = []


def allocate():
    try:
        while len(held) * step < cap:
            held.append(bytearray(b"\1") * step)
    except MemoryError:
        raise OSError(errno.ENOMEM, "MemoryError") from None
    return f"{cap >> 20} MiB, the attack's own cap"


attempt("allocate until refused", allocate)
note("allocated MiB", len(held) * step >> 20)
