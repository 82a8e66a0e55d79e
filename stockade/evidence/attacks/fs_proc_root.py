"""Reach an outside file through /proc: /proc/self/root, our parent's root and cwd (the
sandbox's init), and a host pid's root, cwd, environ and memory (what else of it shows:
proc_visible.py). Reading or writing anything
there is an escape."""

import os

from _common import ARGS, attempt, read, write

outside_file, host_pid = ARGS
outside_dir = os.path.dirname(outside_file)
parent = os.getppid()
for label, base in (("/proc/self/root", "/proc/self/root"),
                    ("/proc/self/root/../..", "/proc/self/root/../.."),
                    ("our parent's root", f"/proc/{parent}/root"),
                    ("our parent's cwd/../..", f"/proc/{parent}/cwd/../.."),
                    (f"/proc/{host_pid}/root", f"/proc/{host_pid}/root")):
    attempt(f"read {label}{outside_file}", lambda b=base: read(b + outside_file))
    attempt(f"write {label}{outside_dir}/planted",
            lambda b=base: write(f"{b}{outside_dir}/planted"))
for item in ("environ", "mem", "cwd/"):
    path = f"/proc/{host_pid}/{item}"
    if item.endswith("/"):
        attempt(f"list {path}", lambda p=path: os.listdir(p))
    else:
        attempt(f"read {path}", lambda p=path: read(p))
