"""Take control of a host process by its pid (argv: its pid and the tag in its command line):
lower its resource limits (a 1 s CPU limit kills it), renice it, pin it to one CPU, make it
SCHED_IDLE and give it the idle I/O class. Any of them working is an escape; the host checks
the process's limits, priority, affinity and scheduling unchanged and it alive."""

import os
import platform
import resource

from _common import ARGS, attempt, note, seen_as, syscall

IOPRIO_SET = {"x86_64": 251, "aarch64": 30}[platform.machine()]
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE = 1, 3

host_pid, host_tag = int(ARGS[0]), ARGS[1]
if seen_as(host_pid, host_tag) is False:
    note("skipped", f"pid {host_pid} names another process here, not the host's")
    raise SystemExit(0)
attempt("prlimit(host process, RLIMIT_NOFILE)",
        lambda: resource.prlimit(host_pid, resource.RLIMIT_NOFILE, (3, 3)))
attempt("prlimit(host process, RLIMIT_CPU 1 s)",
        lambda: resource.prlimit(host_pid, resource.RLIMIT_CPU, (1, 1)))
attempt("setpriority(host process, 19)",
        lambda: os.setpriority(os.PRIO_PROCESS, host_pid, 19))
attempt("setpriority(host process group, 19)",
        lambda: os.setpriority(os.PRIO_PGRP, host_pid, 19))
attempt("sched_setaffinity(host process)",
        lambda: os.sched_setaffinity(host_pid, {max(os.sched_getaffinity(0))}))
attempt("sched_setscheduler(host process, SCHED_IDLE)",
        lambda: os.sched_setscheduler(host_pid, os.SCHED_IDLE, os.sched_param(0)))
attempt("ioprio_set(host process, idle)",
        lambda: syscall(IOPRIO_SET, IOPRIO_WHO_PROCESS, host_pid, IOPRIO_CLASS_IDLE << 13))
