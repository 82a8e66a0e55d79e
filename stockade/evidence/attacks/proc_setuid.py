"""Run a set-user-id program owned by another user (on a terminal, where it waits) and read its
effective uid: gaining that uid is an escape."""

import os
import subprocess
import time

from _common import ARGS, Refused, attempt


def effective_uid(argv):
    """The program's effective uid, watched for a second after it starts (exec closes the
    descriptor Popen waits on a moment before it commits the program's credentials; a program
    that has ended shows its ids until it is reaped)."""
    try:
        master, terminal = os.openpty()
    except OSError:  # (no /dev/ptmx in the view: the landlock tier grants none)
        terminal = subprocess.DEVNULL
    child = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal,
                             start_new_session=True)
    deadline = time.monotonic() + 1.0
    try:
        while True:
            with open(f"/proc/{child.pid}/status") as f:
                real, effective = next(line for line in f
                                       if line.startswith("Uid:")).split()[1:3]
            if effective != real:
                return f"effective uid {effective}, real uid {real}"
            if time.monotonic() > deadline:
                raise Refused("UID_KEPT", f"effective uid stayed {effective}")
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()


attempt(f"gain the owner's uid through {ARGS[0]}", lambda: effective_uid(ARGS))
