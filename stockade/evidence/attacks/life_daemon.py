"""Escape the sandbox's lifetime: double-fork into a new session with stdio closed, a daemon
sleeping 30 s. With `stay`, the original process sleeps too (to be timed out, cancelled or
orphaned); otherwise it exits at once. The host looks for the daemon afterwards."""

import os
import time

from _common import ARGS, note

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(30)
    os._exit(0)
note("daemon", "started")
if ARGS[:1] == ["stay"]:
    time.sleep(30)
