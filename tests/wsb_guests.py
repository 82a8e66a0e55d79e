"""Ways for the Windows Sandbox guest's agent (stockade/vm/wsb_agent.py) to start commands off
Windows, in tests: `posix_spawner`, real POSIX processes (each in a process group of its own,
the group killed as a Job would be); `fake_spawner`, in-process commands made of threads and
pipes, for an interpreter that only looks like Windows (tests/windows_like.py), where no real
process can be started.

Each takes what wsb_guest gives a spawner (the command user's password, the process limit)
and ignores both: they are Windows's (stockade/vm/wsb_winproc.py).

Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading

from stockade.session.errors import StartFailure


class PosixProcess:
    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        if not cwd.startswith("/") or not os.path.isdir(cwd):
            raise StartFailure("cwd_invalid", f"{cwd}: no such directory")
        try:
            self._popen = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           bufsize=0, start_new_session=True)
        except FileNotFoundError as exc:
            raise StartFailure("command_not_found", str(exc)) from None
        except PermissionError as exc:
            raise StartFailure("command_not_executable", str(exc)) from None
        self.pid = self._popen.pid
        self.stdin, self.stdout, self.stderr = (self._popen.stdin, self._popen.stdout,
                                                self._popen.stderr)

    def wait(self) -> None:
        self._popen.wait()

    def kill(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)

    def finish(self) -> tuple[int | None, int | None, float, float]:
        code = self._popen.wait()
        self.kill()  # (what it left in its group, as a Job's end)
        return (code, None, 0.0, 0.0) if code >= 0 else (None, -code, 0.0, 0.0)


def posix_spawner(password: str, pids: int | None):  # noqa: ANN201
    return PosixProcess


class FakeProcess:
    """`echo ARGS...` (stdout), `cat` (stdin to stdout), `fail CODE TEXT` (stderr, then exits
    CODE), `block` (writes `ready` then runs until killed)."""

    pids = iter(range(1000, 1 << 30))

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        if not (len(cwd) > 2 and cwd[1:3] == ":\\"):
            raise StartFailure("cwd_invalid", f"{cwd}: not a drive path")
        if argv[0] not in ("echo", "cat", "fail", "block"):
            raise StartFailure("command_not_found", f"{argv[0]}: no such program")
        self.pid = next(self.pids)
        pipes = [os.pipe() for _ in range(3)]
        self.stdin = open(pipes[0][1], "wb", buffering=0)  # noqa: SIM115
        self.stdout = open(pipes[1][0], "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(pipes[2][0], "rb", buffering=0)  # noqa: SIM115
        self._ends = (pipes[0][0], pipes[1][1], pipes[2][1])
        self._killed = threading.Event()
        self._code: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(argv,), daemon=True).start()

    def _run(self, argv: list[str]) -> None:
        stdin, out, err = self._ends
        try:
            if argv[0] == "echo":
                os.write(out, " ".join(argv[1:]).encode() + b"\n")
            elif argv[0] == "cat":
                while data := os.read(stdin, 65536):
                    os.write(out, data)
            elif argv[0] == "fail":
                os.write(err, argv[2].encode())
                self._code = int(argv[1])
            else:
                os.write(out, b"ready\n")
                self._killed.wait()
        finally:
            for fd in self._ends:
                os.close(fd)
            if self._code is None:
                self._code = 1 if self._killed.is_set() else 0
            self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def kill(self) -> None:
        self._killed.set()

    def finish(self) -> tuple[int | None, int | None, float, float]:
        return self._code, None, 0.0, 0.0


def fake_spawner(password: str, pids: int | None):  # noqa: ANN201
    return FakeProcess
