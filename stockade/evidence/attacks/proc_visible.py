"""See a host process (argv: its pid and the tag in its command line): read its command line and
status, list its descriptors, take a pidfd on it. A sandbox with a pid namespace of its own
shows none of it."""

import os

from _common import ARGS, attempt, note, read, seen_as

host_pid, host_tag = int(ARGS[0]), ARGS[1]
if seen_as(host_pid, host_tag) is False:
    note("skipped", f"pid {host_pid} names another process here, not the host's")
    raise SystemExit(0)
attempt(f"read /proc/{host_pid}/cmdline", lambda: read(f"/proc/{host_pid}/cmdline"))
attempt(f"read /proc/{host_pid}/status", lambda: read(f"/proc/{host_pid}/status"))
attempt(f"list /proc/{host_pid}/fd/", lambda: os.listdir(f"/proc/{host_pid}/fd/"))
attempt("pidfd_open(host process)", lambda: os.close(os.pidfd_open(host_pid)))
