"""Escape the sandbox's lifetime: double-fork into a new session with stdio closed, a daemon
sleeping 30 s. With `stay`, the original process sleeps too (to be timed out, cancelled or
orphaned); otherwise it exits at once. The host looks for the daemon afterwards."""

import time

from _common import ARGS, daemonize

daemonize()
if ARGS[:1] == ["stay"]:
    time.sleep(30)
