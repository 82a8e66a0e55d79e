"""Signal a host process by its pid and process group, and take a pidfd on it: any of these
reaching it is an escape."""

import os
import signal

from _common import ARGS, attempt, note

host_pid = int(ARGS[0])
if os.path.exists(f"/proc/{host_pid}"):
    note("skipped", f"pid {host_pid} names a sandbox process here, not the host's")
else:
    attempt(f"kill({host_pid}, 0)", lambda: os.kill(host_pid, 0))
    attempt(f"kill({host_pid}, SIGTERM)", lambda: os.kill(host_pid, signal.SIGTERM))
    attempt(f"kill(-{host_pid}, SIGUSR1)", lambda: os.kill(-host_pid, signal.SIGUSR1))
    attempt(f"pidfd_open({host_pid})", lambda: os.close(os.pidfd_open(host_pid)))
