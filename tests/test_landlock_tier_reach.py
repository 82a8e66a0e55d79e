"""The landlock tier cannot touch what is not its own (issue 29, G2-G4): a host process's
limits, priority, affinity and scheduling, its keeper, extended attributes of the user's files
(a change set's user.overlay.* among them), and Stockade's state directory inside a root.
Nor can it watch the host's files (inotify). Every test runs a real command in the real tier
and checks the host side."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PYTHON, gone, policy_for

import stockade
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import execute
from stockade.linux.backend import LinuxBackend
from stockade.linux.landlock_tier import ROOT_PIDS
from stockade.policy import preset

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


def test_a_preset_runs_in_the_tier_as_root_with_its_pids_lifted_and_said(ws, tmp_path):
    """Issue 32: as root the tier refused every preset (their limits.pids: RLIMIT_NPROC does
    not bind uid 0). A preset's limit is now lifted there, and said; a policy's own pids is
    still refused as root (and held by everyone else)."""
    workspace, _ = ws
    run = [sys.executable, "-m", "stockade", "run", "--workspace", str(workspace)]
    env = {**os.environ, "STOCKADE_NO_SERVER": "1"}
    done = subprocess.run([*run, "--isolation", "landlock", "--preset", "workspace-write", "--",
                           "sh", "-c", "echo ran"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    warned = "stockade: warning: limits.pids (the preset's 512) is not enforced" in done.stderr
    assert warned is ROOT, done.stderr
    result = stockade.run(["true"], replace(preset("workspace-write"), isolation="landlock"),
                          workspace=workspace)
    assert (ROOT_PIDS in result.enforced["not_enforced"]) is ROOT
    own = tmp_path / "own.toml"
    own.write_text('version = 1\npreset = "workspace-write"\nisolation = "landlock"\n'
                   "[limits]\npids = 7\n")
    done = subprocess.run([*run, "--policy", str(own), "--", "true"], capture_output=True,
                          text=True, env=env, timeout=60)
    if ROOT:
        assert done.returncode == 70
        assert done.stderr.startswith("stockade: unenforceable:limits.pids: "), done.stderr
    else:
        assert (done.returncode, done.stderr) == (0, "")


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


STATE_PLACE = {"STOCKADE_STATE_DIR": "state", "XDG_STATE_HOME": "xdg/stockade",
               "HOME": ".local/state/stockade"}


@pytest.mark.parametrize("source", sorted(STATE_PLACE))
@pytest.mark.parametrize("preset", ["workspace-write", "read-only"])
def test_a_root_holding_the_state_directory_is_refused(ws, monkeypatch, source, preset):
    """A write or read root that holds Stockade's state directory (from any of its sources,
    there or not yet) is refused, typed, before anything runs: Landlock rules only add rights,
    so carving it out of the root could not keep out one made later. Failed before: the
    command ran (the workspace was granted with the state directory carved out)."""
    workspace, _ = ws
    if source != "STOCKADE_STATE_DIR":
        monkeypatch.delenv("STOCKADE_STATE_DIR")
    monkeypatch.setenv(source, str(workspace / ("xdg" if source == "XDG_STATE_HOME" else ""))
                       if source != "STOCKADE_STATE_DIR" else str(workspace / "state"))
    state = workspace / STATE_PLACE[source]
    # (no deny list: with HOME there, the presets' denied credentials would be missing from a
    # write root, refused first)
    policy = replace(policy_for(preset, deny=()), isolation="landlock")
    if ROOT:
        policy = replace(policy, limits=replace(policy.limits, pids=None))
    with pytest.raises(stockade.UnenforceableError) as refused:
        stockade.run(["/bin/sh", "-c", "echo ran > ran"], policy, workspace=workspace)
    assert refused.value.code == "unenforceable:filesystem.stockade_state"
    knob = "filesystem.write" if preset == "workspace-write" else "filesystem.read"
    assert f"the {knob} root {workspace} holds Stockade's state directory {state}," \
        in refused.value.message
    assert "isolation namespaces" in refused.value.message
    assert not (workspace / "ran").exists()


def test_the_cli_refuses_a_workspace_holding_the_state_directory(ws, tmp_path):
    """The same through `stockade run`: its exit status and reason code, no traceback."""
    workspace, _ = ws
    policy = tmp_path / "policy.toml"
    policy.write_text('version = 1\npreset = "workspace-write"\nisolation = "landlock"\n'
                      '[limits]\npids = "unlimited"\n')  # (the tier refuses pids as root)
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "--state-dir", str(workspace / "state"), "run",
         "--policy", str(policy), "--workspace", str(workspace), "--", "/bin/sh", "-c",
         "echo ran > ran"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(stockade.__file__).parent.parent)})
    assert done.returncode != 0 and not (workspace / "ran").exists()
    assert "unenforceable:filesystem.stockade_state" in done.stderr, done.stderr
    assert str(workspace / "state") in done.stderr and "Traceback" not in done.stderr


LIST_STATE = textwrap.dedent("""
    import os, sys
    try:
        print("listed:", sorted(os.listdir(sys.argv[1])))
    except OSError as exc:
        print("refused:", exc.strerror)
""")


def test_without_the_refusal_the_state_directory_is_not_hidden(ws, monkeypatch):
    """Control: with the refusal switched off (`stockade_state`, tests only) the same launch
    runs, and the command lists the state directory the root holds."""
    workspace, _ = ws
    state = workspace / "state"
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state))
    (state / "records").mkdir(parents=True, mode=0o700)
    request = compile_policy(tier_policy(), [PYTHON, "-c", LIST_STATE, str(state)],
                             CompileContext.current(workspace))
    backend = LinuxBackend(weaken=frozenset({"stockade_state"})).tier("landlock")
    result = execute(backend, request)
    assert result.stdout.decode().strip() == "listed: ['records']", result.stderr


CHMOD = TRY + textwrap.dedent("""
    state = sys.argv[1]
    fd = os.open(state, os.O_PATH)
    attempt("chmod 0777", lambda: os.chmod(state, 0o777))
    attempt("chmod o+w", lambda: os.chmod(state, 0o702))
    attempt("fchmodat via O_PATH", lambda: os.chmod(f"/proc/self/fd/{fd}", 0o777))
    attempt("chmod own 0755", lambda: os.chmod("mine", 0o755))
    attempt("chmod own 0777", lambda: os.chmod("mine", 0o777))
""")


def test_the_state_directory_cannot_be_opened_to_other_users(ws, monkeypatch, tmp_path):
    """G4: with no mount view, chmod reaches every file of the user's (Landlock does not
    govern modes): the command made Stockade's state directory 0777. A mode that lets other
    users write is now refused to every chmod (EPERM); an ordinary one works in the
    workspace. Failed before: chmod 0777 worked and the host saw the state directory 0777."""
    workspace, _ = ws
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state))
    (workspace / "mine").write_text("#!/bin/sh\n")
    result = stockade.run([PYTHON, "-c", CHMOD, str(state)], tier_policy(), workspace=workspace)
    said = outcomes(result.stdout)
    assert result.returncode == 0, result.stderr
    assert said == {"chmod 0777": "EPERM", "chmod o+w": "EPERM", "fchmodat via O_PATH": "EPERM",
                    "chmod own 0755": "ALLOWED", "chmod own 0777": "EPERM"}, said
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((workspace / "mine").stat().st_mode) == 0o755


def test_a_workspace_below_home_with_the_state_elsewhere_works(tmp_path, monkeypatch):
    """The everyday job: $HOME holds the default state directory, the workspace is a project
    below it: the launch runs, writes and makes a script executable."""
    home = tmp_path / "home"
    project = home / "project"
    project.mkdir(parents=True)
    (home / ".local" / "state" / "stockade").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    result = stockade.run(["/bin/sh", "-c", "echo 'echo hi' > run.sh && chmod +x run.sh && "
                           "./run.sh"], tier_policy(), workspace=project)
    assert (result.returncode, result.stdout) == (0, b"hi\n"), result.stderr


WATCH = TRY + textwrap.dedent("""
    import select
    IN_ALL_EVENTS, IN_CLOEXEC = 0xFFF, 0o2000000
    fd = libc.inotify_init1(IN_CLOEXEC)
    print(f"inotify_init1: {errno.errorcode[ctypes.get_errno()] if fd < 0 else 'ALLOWED'}",
          flush=True)
    def watch(path):
        if libc.inotify_add_watch(fd, path.encode(), IN_ALL_EVENTS) == -1:
            raise OSError(ctypes.get_errno(), "")
    for path in sys.argv[1:]:
        attempt(f"watch {path}", lambda: watch(path))
    open("ready", "w").close()  # (the host's activity outside starts now)
    seen = select.select([fd], [], [], 10)[0] if fd >= 0 else []
    print(f"events: {len(os.read(fd, 4096)) if seen else 0}", flush=True)
""")


def watched(ws, backend=None) -> dict[str, str]:
    """What a command watching `outside` (a directory and a file in it) and its own workspace
    said, while the host wrote a file outside once it was ready."""
    workspace, outside = ws
    (outside / "notes").write_text("host\n")
    targets = [str(outside), str(outside / "notes"), str(workspace)]
    command = [PYTHON, "-c", WATCH, *targets]

    def host_activity() -> None:
        deadline = time.monotonic() + 30
        while not (workspace / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (outside / "notes").write_text("written by the host meanwhile\n")

    writer = threading.Thread(target=host_activity)
    writer.start()
    try:
        if backend is None:
            result = stockade.run(command, tier_policy(), workspace=workspace)
        else:
            request = compile_policy(tier_policy(), command, CompileContext.current(workspace))
            result = execute(backend, request)
    finally:
        writer.join()
    assert result.returncode == 0, result.stderr
    return outcomes(result.stdout)


def test_no_watch_tells_the_command_of_the_hosts_activity(ws):
    """Issue 29 (T1): a watch needs no right to open what it watches, and Landlock does not
    govern it: the command watched a directory and a file outside every root and learned of
    each write there. inotify is now ENOSYS in the tier (as on a kernel without it: callers
    fall back to polling), in the workspace too (a filter cannot tell paths apart). Failed
    before: every watch was ALLOWED and the host's write came through as events."""
    workspace, outside = ws
    said = watched(ws)
    assert said == {"inotify_init1": "ENOSYS", "events": "0",
                    **{f"watch {path}": "ENOSYS"
                       for path in (outside, outside / "notes", workspace)}}, said


def test_without_the_refusal_a_watch_outside_sees_the_host_write(ws):
    """Control: with the refusal switched off (`inotify`, tests only), the same watches are
    made and the host's write outside every root reaches the command as events."""
    workspace, outside = ws
    said = watched(ws, LinuxBackend(weaken=frozenset({"inotify"})).tier("landlock"))
    assert said["inotify_init1"] == "ALLOWED" and said[f"watch {outside}"] == "ALLOWED", said
    assert int(said["events"]) > 0, said


def test_tail_follows_a_file_by_polling(ws):
    """The everyday job: `tail -f` finds no inotify, says so and polls instead."""
    result = stockade.run(["/bin/sh", "-c", "echo one > log; tail -s 0.1 -f log & sleep 1; "
                           "echo two >> log; sleep 1; kill $!"], tier_policy(),
                          workspace=ws[0], text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "one\ntwo\n", (result.stdout, result.stderr)
    assert "reverting to polling" in result.stderr, result.stderr
