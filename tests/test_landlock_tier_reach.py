"""The landlock tier cannot touch what is not its own (issue 29, G2-G4): a host process's
limits, priority, affinity and scheduling, its keeper, extended attributes of the user's files
(a change set's user.overlay.* among them), and Stockade's state directory inside a root.
Every test runs a real command in the real tier and checks the host side."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from dataclasses import replace

import pytest
from conftest import PYTHON, gone, policy_for

import stockade

pytestmark = pytest.mark.usefixtures("linux")
ROOT = os.geteuid() == 0


def tier_policy(**changes) -> stockade.Policy:
    """workspace-write in the landlock tier (as root without limits.pids, refused there)."""
    policy = replace(policy_for(**changes), isolation="landlock")
    return replace(policy, limits=replace(policy.limits, pids=None)) if ROOT else policy


def outcomes(stdout: bytes) -> dict[str, str]:
    """`name: outcome` lines of the child."""
    return dict(line.split(": ", 1) for line in stdout.decode().splitlines() if ": " in line)


TRY = textwrap.dedent("""
    import ctypes, errno, os, resource, sys
    libc = ctypes.CDLL(None, use_errno=True)
    def attempt(name, action):
        try:
            action()
            print(f"{name}: ALLOWED", flush=True)
        except OSError as exc:
            print(f"{name}: {errno.errorcode[exc.errno]}", flush=True)
    def call(nr, *args):
        if libc.syscall(nr, *args) == -1:
            raise OSError(ctypes.get_errno(), "")
""")

CONTROL = TRY + textwrap.dedent("""
    host = int(sys.argv[1])
    ioprio_set, kcmp = (251, 312) if os.uname().machine == "x86_64" else (30, 272)
    attempt("prlimit", lambda: resource.prlimit(host, resource.RLIMIT_NOFILE, (7, 7)))
    attempt("prlimit own pid", lambda: resource.prlimit(os.getpid(), resource.RLIMIT_CORE,
                                                        (0, 0)))
    attempt("prlimit self", lambda: resource.prlimit(0, resource.RLIMIT_CORE, (0, 0)))
    attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, host, 19))
    attempt("setpriority group", lambda: os.setpriority(os.PRIO_PGRP, host, 19))
    attempt("setpriority user", lambda: os.setpriority(os.PRIO_USER, 0, os.getpriority(
        os.PRIO_PROCESS, 0)))
    attempt("setpriority self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))
    attempt("affinity", lambda: os.sched_setaffinity(host, {min(os.sched_getaffinity(0))}))
    attempt("affinity self", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
    attempt("scheduler", lambda: os.sched_setscheduler(host, os.SCHED_IDLE, os.sched_param(0)))
    attempt("sched_setparam", lambda: os.sched_setparam(host, os.sched_param(0)))
    attempt("ioprio_set", lambda: call(ioprio_set, 1, host, 3 << 13))
    attempt("ioprio_set user", lambda: call(ioprio_set, 3, 0, 3 << 13))
    attempt("kcmp", lambda: call(kcmp, host, os.getpid(), 0, 0, 0))
""")
REFUSED = ("prlimit", "prlimit own pid", "setpriority", "setpriority group",
           "setpriority user", "affinity", "scheduler", "sched_setparam", "ioprio_set",
           "ioprio_set user", "kcmp")


def state_of(pid: int) -> tuple[object, ...]:
    """What the command could change of a host process: limits, nice, affinity, policy."""
    with open(f"/proc/{pid}/limits") as f:
        limits = f.read()
    return (limits, os.getpriority(os.PRIO_PROCESS, pid), os.sched_getaffinity(pid),
            os.sched_getscheduler(pid))


def test_a_host_process_is_out_of_reach(ws):
    """G2: prlimit64 set a host process's limits; each such call now refuses any pid but 0
    (the caller's own pid too: a filter cannot tell it from another)."""
    host = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        before = state_of(host.pid)
        result = stockade.run([PYTHON, "-c", CONTROL, str(host.pid)], tier_policy(),
                              workspace=ws[0])
        said = outcomes(result.stdout)
        assert result.returncode == 0, result.stderr
        assert {name: said.get(name) for name in REFUSED} == dict.fromkeys(REFUSED, "EPERM")
        assert said["prlimit self"] == said["setpriority self"] == said["affinity self"] \
            == "ALLOWED"
        assert state_of(host.pid) == before and host.poll() is None
    finally:
        host.kill()
        host.wait()


KEEPER = TRY + textwrap.dedent("""
    keeper, marker = os.getppid(), sys.argv[1]
    attempt("prlimit keeper", lambda: resource.prlimit(keeper, resource.RLIMIT_NOFILE, (0, 0)))
    attempt("setpriority keeper", lambda: os.setpriority(os.PRIO_PROCESS, keeper, 19))
    attempt("signal keeper", lambda: os.kill(keeper, 19))
    attempt("oom_score_adj keeper", lambda: open(f"/proc/{keeper}/oom_score_adj", "w").write(
        "1000"))
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", marker])
        os._exit(0)
""")


def test_the_keeper_is_out_of_reach_and_nothing_outlives_the_run(ws):
    """G3: with its keeper's RLIMIT_NOFILE at 0, the keeper could not pin (pidfd) nor find
    (/proc) the command's daemon, which outlived the run (the run itself never ended: the
    timeout bounds it)."""
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    result = stockade.run([PYTHON, "-c", KEEPER, marker], tier_policy(timeout=15.0),
                          workspace=ws[0])
    said = outcomes(result.stdout)
    assert result.returncode == 0, result.stderr
    assert said == {"prlimit keeper": "EPERM", "setpriority keeper": "EPERM",
                    "signal keeper": "EPERM", "oom_score_adj keeper": "EACCES"}, said
    assert gone(marker, within=5)


XATTRS = TRY + textwrap.dedent("""
    for path in sys.argv[1:]:
        attempt(f"setxattr {path}", lambda: os.setxattr(path, "user.overlay.opaque", b"y"))
        attempt(f"removexattr {path}", lambda: os.removexattr(path, "user.kept"))
        attempt(f"fd setxattr {path}", lambda: os.setxattr(os.open(path, os.O_RDONLY),
                                                         "user.overlay.opaque", b"y"))
""")


def test_extended_attributes_cannot_be_set(ws, tmp_path):
    """G4: Landlock does not govern extended attributes, so the command set user.overlay.opaque
    on another run's upper layer (a directory outside every root, in the state directory);
    `apply` then deleted host files. Now every set or removal is refused (EOPNOTSUPP)."""
    workspace, outside = ws
    targets = [outside / "upper", workspace / "mine"]
    for target in targets:
        target.mkdir()
        os.setxattr(target, "user.kept", b"1")
    result = stockade.run([PYTHON, "-c", XATTRS, *map(str, targets)], tier_policy(),
                          workspace=workspace)
    said = outcomes(result.stdout)
    assert result.returncode == 0, result.stderr
    opened = {f"fd setxattr {outside / 'upper'}": "EACCES"}  # (Landlock: no right to open it)
    assert said == {f"{kind} {target}": opened.get(f"{kind} {target}", "ENOTSUP")
                    for target in targets
                    for kind in ("setxattr", "removexattr", "fd setxattr")}, said
    for target in targets:
        assert os.listxattr(target) == ["user.kept"]
