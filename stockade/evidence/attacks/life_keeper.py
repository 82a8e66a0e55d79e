"""Disarm the process that reaps this tree (the parent: the landlock tier's keeper, or a
sandbox's own pid 1) and outlive the run: set its RLIMIT_NOFILE to 0 (it can then open no
pidfd nor read /proc to find what to kill) and its RLIMIT_NPROC to 1, then double-fork a
setsid daemon sleeping 30 s and exit. The host looks for the daemon afterwards. (Its renice
and its oom_score_adj are refused by the kernel and Landlock even without the tier's process
rules: tests/test_landlock_tier_reach.py tries them.)"""

import os
import resource

from _common import attempt, daemonize

keeper = os.getppid()
attempt("prlimit(keeper, RLIMIT_NOFILE 0)",
        lambda: resource.prlimit(keeper, resource.RLIMIT_NOFILE, (0, 0)))
attempt("prlimit(keeper, RLIMIT_NPROC 1)",
        lambda: resource.prlimit(keeper, resource.RLIMIT_NPROC, (1, 1)))
daemonize()
