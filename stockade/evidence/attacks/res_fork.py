"""Fork bomb: fork until the kernel refuses (stopping at the given cap on our own, so a broken
sandbox does not take the host down), every copy sleeping. The count reached is printed."""

import os
import time

from _common import ARGS, attempt, note

cap = int(ARGS[0])
count = 0


def bomb():
    global count
    while count < cap:
        if os.fork() == 0:
            # (its streams closed: the launch ends with the attack, and a copy that outlives
            # it is a survivor the host sees at once)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            time.sleep(60)
            os._exit(0)
        count += 1
    return f"{count} processes, the attack's own cap"


attempt("fork until refused", bomb)
note("processes", count)
