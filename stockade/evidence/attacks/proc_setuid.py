"""Run a set-user-id program owned by another user (on a terminal, where it waits) and read its
effective uid: gaining that uid is an escape."""

import os
import subprocess
import time

from _common import ARGS, Refused, attempt


def effective_uid(argv):
    master, slave = os.openpty()
    child = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                             start_new_session=True)
    try:
        time.sleep(0.3)
        with open(f"/proc/{child.pid}/status") as f:
            real, effective = next(line for line in f if line.startswith("Uid:")).split()[1:3]
    finally:
        child.kill()
        child.wait()
    if effective != real:
        return f"effective uid {effective}, real uid {real}"
    raise Refused("UID_KEPT", f"effective uid stayed {effective}")


attempt(f"gain the owner's uid through {ARGS[0]}", lambda: effective_uid(ARGS))
