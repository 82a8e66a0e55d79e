"""One command of a session, as the guest agent runs it: a child in its own process group with
only stdin/stdout/stderr (pipes to the agent), and the command's argv, cwd and environment.

It is started with posix_spawn (a vfork: no copy of the agent's memory). The agent is
single-threaded, so it simply moves into the command's cwd first (and stays there). Every
descriptor the agent holds besides its stdio is close-on-exec (Python's default), and the
agent's own stdin/stdout — the channel to its host — are replaced by the command's pipes, so
the command inherits exactly 0, 1 and 2.

The agent is a child subreaper: whatever a command leaves behind, even processes that left its
process group or session, is re-parented to the agent, and `sweep` kills and reaps it when the
command ends — all of it, or (a session opened with `keep_detached`) all but the sessions the
agent says to spare.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import time
from collections.abc import Callable
from typing import IO

from stockade.session.errors import StartFailure

RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)  # Python ignores these; a command must not


class Child:
    """A started command. stdin/stdout/stderr are the agent's ends of its pipes."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        if not cwd.startswith("/"):  # (a Windows drive path: protocol version 3's other kind)
            raise StartFailure("cwd_invalid", f"{cwd}: not a POSIX path")
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise StartFailure("cwd_invalid", f"{cwd}: {exc.strerror}") from None
        program = _find(argv[0], env)
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        try:
            self.pid = os.posix_spawn(
                program, argv, env, setpgroup=0, setsigdef=RESET_SIGNALS,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, target)
                              for target, fd in enumerate(theirs)])
        except OSError as exc:
            for read, write in pipes:
                os.close(read)
                os.close(write)
            raise _start_failure(exc, argv[0]) from None
        for fd in theirs:
            os.close(fd)
        self.started = time.monotonic()
        self.pidfd = os.pidfd_open(self.pid)
        self.stdin: IO[bytes] = open(pipes[0][1], "wb", buffering=0)  # noqa: SIM115
        self.stdout: IO[bytes] = open(pipes[1][0], "rb", buffering=0)  # noqa: SIM115
        self.stderr: IO[bytes] = open(pipes[2][0], "rb", buffering=0)  # noqa: SIM115
        self.exited: float | None = None

    def kill(self) -> None:
        """SIGKILL the command's whole process group (idempotent)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def reap(self, spare: Callable[[int], bool] = lambda session: False
             ) -> tuple[int | None, int | None, float, float]:
        """(exit code, signal, user s, system s) of the exited command; then kills what it
        left behind (its process group, and every other descendant but those in a session
        `spare` keeps: see `sweep`)."""
        self.kill()  # while its zombie still holds the group's id
        _, status, usage = os.wait4(self.pid, 0)
        self.exited = time.monotonic()
        os.close(self.pidfd)
        sweep(spare)
        if os.WIFSIGNALED(status):
            return None, os.WTERMSIG(status), usage.ru_utime, usage.ru_stime
        return os.WEXITSTATUS(status), None, usage.ru_utime, usage.ru_stime


def sweep(spare: Callable[[int], bool] = lambda session: False) -> None:
    """Kill and reap every child this process still has (orphans are re-parented to it), but
    those whose session id `spare` keeps. A process never joins a session it was not born in
    but by making its own (setsid), so what is in the agent's session stays killable, and a
    kept process's descendants are all in kept sessions or new ones."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        victims = [child for child, session in _children() if not spare(session)]
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not victims:
            return
        os.waitpid(-1, 0)


def reap_exited(running: int | None) -> None:
    """Reap every child that has exited, but the command `running` (its own wait takes its
    status): processes a session keeps (keep_detached) exit between commands too, and a
    zombie would hold a pid of limits.pids."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == running:
            return  # (the rest waits for the command's own reap, which sweeps them)
        os.waitpid(info.si_pid, 0)


def sessions() -> frozenset[int]:
    """The session ids of this process's children."""
    return frozenset(session for _, session in _children())


def _children() -> list[tuple[int, int]]:
    """(pid, session id) of each child of this process."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as info:
                    fields = info.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # it is gone already
            if int(fields[1]) == me:
                found.append((int(entry), int(fields[3])))
    return found


def _find(program: str, env: dict[str, str]) -> str:
    """`program` searched in the command's own PATH (as execvp does), or as given."""
    if "/" in program:
        return program
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        try:
            if stat.S_ISREG(os.stat(candidate).st_mode) and os.access(candidate, os.X_OK):
                return candidate
        except OSError:
            continue
    raise StartFailure("command_not_found", f"{program}: not found in PATH")


def _start_failure(exc: OSError, program: str) -> StartFailure:
    if exc.errno == errno.ENOENT:
        return StartFailure("command_not_found", f"{program}: {exc.strerror}")
    if exc.errno in (errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EPERM, errno.EISDIR):
        return StartFailure("command_not_executable", f"{program}: {exc.strerror}")
    return StartFailure("start_failed", f"{program}: {exc.strerror or exc}")
