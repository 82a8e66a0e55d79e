"""Signal a host process by its pid and process group, and take a pidfd on it (argv: its pid
and the tag in its command line): any of these reaching it is an escape."""

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
    attempt("pidfd_open(host process)", lambda: os.close(os.pidfd_open(host_pid)))
