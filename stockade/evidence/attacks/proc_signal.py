"""Signal a host process by its pid and process group (argv: its pid and the tag in its command
line): a signal reaching it is an escape. (Seeing it at all: proc_visible.py.)"""

import os
import signal

from _common import ARGS, attempt, note, seen_as

host_pid, host_tag = int(ARGS[0]), ARGS[1]


if seen_as(host_pid, host_tag) is False:
    note("skipped", f"pid {host_pid} names another process here, not the host's")
else:
    attempt("kill(host process, 0)", lambda: os.kill(host_pid, 0))
    attempt("kill(host process, SIGTERM)", lambda: os.kill(host_pid, signal.SIGTERM))
    attempt("kill(-host process group, SIGUSR1)", lambda: os.kill(-host_pid, signal.SIGUSR1))
