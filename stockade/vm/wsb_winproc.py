"""How the Windows Sandbox guest's agent starts a command (wsb_agent.Spawn), on Windows.

The agent is the guest's administrator (it locked the firewall); a command must not be, or it
could undo the lock. So each command runs as the standard guest user the bootstrap created
(`CreateProcessWithLogonW` with its password, suspended), in a Job of its own (kill-on-close, no
breakaway, `limits.pids` as its process limit: windows/job.py's plan), and only then resumes.
Its stdin, stdout and stderr are pipes to the agent, the only handles it is given. When its own
process exits, at its timeout and on cancel, the Job is terminated: nothing it started outlives
it, and the agent reads its pipes to their end.

The secondary logon service puts such a process in a Job of its own before ours; Windows nests
ours in it (Windows 8 and later). A Job nests in another only if neither sets UI limits, and
that Job's are not documented, so ours sets none: the guest has no other user's windows or
clipboard to protect. What a real guest does with all of this is the manual check's
(docs/windows-sandbox.md).
"""

from __future__ import annotations

import ctypes
import functools
import ntpath
import os
from types import SimpleNamespace

from stockade.errors import StartError
from stockade.launch.request import LimitSpec
from stockade.session.errors import StartFailure
from stockade.vm.wsb_agent import Spawn, Status
from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.cmdline import command_line, resolve_program
from stockade.windows.envblock import environment_block
from stockade.windows.job import (
    JobPlan,
    active_processes,
    create_job,
    drained,
    job_plan,
    without_ui_limits,
)
from stockade.windows.structs import (
    BOOL,
    DWORD,
    HANDLE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION,
    PROCESS_INFORMATION,
    PVOID,
    STARTUPINFOW,
)

LOGON_WITH_PROFILE = 0x00000001  # the user's profile loaded: a home, TEMP, a registry hive
CREATE_NO_WINDOW = 0x08000000
CREATION_FLAGS = c.CREATE_SUSPENDED | c.CREATE_UNICODE_ENVIRONMENT | CREATE_NO_WINDOW
INFINITE = 0xFFFFFFFF
ENDED = 1  # the exit code of what the agent ends (its Job terminated)
TICKS = 10_000_000  # a Job's CPU times are in 100-nanosecond units
# Win32 errors from the start, as the protocol's per-command codes
_START_CODES = {2: "command_not_found", 3: "command_not_found", 267: "cwd_invalid",
                5: "command_not_executable", 193: "command_not_executable"}


def spawner(user: str, password: str, pids: int | None) -> Spawn:
    """Start commands as `user` (a local account), each in a Job holding at most `pids`
    processes."""
    plan = without_ui_limits(job_plan(LimitSpec(pids=pids), os.cpu_count() or 1))
    win32()  # (now: a guest whose Win32 functions are missing refuses its boot, typed)
    _bound()

    def spawn(argv: list[str], cwd: str, env: dict[str, str]) -> JobProcess:
        return JobProcess(argv, cwd, env, user, password, plan)

    return spawn


class JobProcess:
    """A command started as the command user, in its own Job (wsb_agent.Process)."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], user: str,
                 password: str, plan: JobPlan) -> None:
        if not (ntpath.isabs(cwd) and ntpath.splitdrive(cwd)[0]) or not os.path.isdir(cwd):
            raise StartFailure("cwd_invalid", f"{cwd}: not a folder of this guest")
        variables = tuple(env.items())
        try:
            program = resolve_program(argv[0], cwd, variables, os.path.isfile)
            line, block = command_line(argv), environment_block(variables)
        except StartError as exc:
            raise StartFailure(exc.code, exc.message) from None
        except ValueError as exc:
            raise StartFailure("start_failed", str(exc)) from None
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        job = None
        try:
            job = create_job(plan)
            for fd in theirs:
                os.set_inheritable(fd, True)  # (the logon service duplicates them into it)
            info = _create(user, password, program, line, block, cwd, theirs)
            _start_in(job, info)
        except BaseException as exc:
            for fd in ours:
                os.close(fd)
            if job is not None:
                win32().CloseHandle(job)
            if isinstance(exc, OSError):
                raise StartFailure("start_failed", f"{argv[0]}: {exc.strerror or exc}") from None
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = info.dwProcessId
        self._process, self._job = info.hProcess, job
        self.stdin = open(ours[0], "wb", buffering=0)  # noqa: SIM115
        self.stdout = open(ours[1], "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(ours[2], "rb", buffering=0)  # noqa: SIM115
        self._closed = False

    def wait(self) -> None:
        win32().WaitForSingleObject(self._process, INFINITE)

    def kill(self) -> None:
        if not self._closed:
            try:
                win32().TerminateJobObject(self._job, ENDED)
            except OSError:
                pass  # (it has ended already)

    def finish(self) -> Status:
        api = win32()
        code = DWORD()
        api.GetExitCodeProcess(self._process, ctypes.byref(code))
        self.kill()
        drained(lambda: active_processes(self._job))
        times = JOBOBJECT_BASIC_ACCOUNTING_INFORMATION()
        api.QueryInformationJobObject(self._job, c.JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION,
                                      ctypes.byref(times), ctypes.sizeof(times),
                                      ctypes.byref(DWORD()))
        self._closed = True
        api.CloseHandle(self._process)
        api.CloseHandle(self._job)
        return code.value, None, times.TotalUserTime / TICKS, times.TotalKernelTime / TICKS


def _create(user: str, password: str, program: str, line: str, block: str, cwd: str,
            stdio: list[int]) -> PROCESS_INFORMATION:
    import msvcrt  # Windows only

    startup = STARTUPINFOW()
    startup.cb = ctypes.sizeof(STARTUPINFOW)
    startup.dwFlags = c.STARTF_USESTDHANDLES
    startup.hStdInput, startup.hStdOutput, startup.hStdError = (
        msvcrt.get_osfhandle(fd) for fd in stdio)
    info = PROCESS_INFORMATION()
    try:
        _bound().CreateProcessWithLogonW(
            user, ".", password, LOGON_WITH_PROFILE, program,
            ctypes.create_unicode_buffer(line), CREATION_FLAGS,
            ctypes.create_unicode_buffer(block), cwd, ctypes.byref(startup), ctypes.byref(info))
    except OSError as exc:
        code = _START_CODES.get(getattr(exc, "winerror", None) or 0, "start_failed")
        raise StartFailure(code, f"{program}: {exc.strerror or exc}") from None
    return info


def _start_in(job: int, info: PROCESS_INFORMATION) -> None:
    """Put the suspended process in `job`, then let it run; a process that cannot be put in
    it is ended before it ran."""
    api = win32()
    try:
        _bound().AssignProcessToJobObject(job, info.hProcess)
        if api.ResumeThread(info.hThread) == INFINITE:
            raise ctypes.WinError(ctypes.get_last_error())
    except OSError as exc:
        _bound().TerminateProcess(info.hProcess, ENDED)
        api.CloseHandle(info.hProcess)
        raise StartFailure("start_failed", f"the command's Job: {exc.strerror or exc}") from None
    finally:
        api.CloseHandle(info.hThread)


def _checked(result, func, args):  # noqa: ANN001, ANN202 - ctypes' errcheck
    if not result:
        error = ctypes.WinError(ctypes.get_last_error())
        error.strerror = f"{func.__name__}: {error.strerror}"
        raise error
    return result


@functools.cache
def _bound() -> SimpleNamespace:
    """The functions windows/api.py does not bind."""
    advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    functions = {
        "CreateProcessWithLogonW": (advapi32, [ctypes.c_wchar_p, ctypes.c_wchar_p,
                                               ctypes.c_wchar_p, DWORD, ctypes.c_wchar_p,
                                               ctypes.c_wchar_p, DWORD, PVOID,
                                               ctypes.c_wchar_p,
                                               ctypes.POINTER(STARTUPINFOW),
                                               ctypes.POINTER(PROCESS_INFORMATION)]),
        "AssignProcessToJobObject": (kernel32, [HANDLE, HANDLE]),
        "TerminateProcess": (kernel32, [HANDLE, ctypes.c_uint]),
    }
    bound = {}
    for name, (dll, argtypes) in functions.items():
        func = getattr(dll, name)
        func.restype, func.argtypes, func.errcheck = BOOL, argtypes, _checked
        bound[name] = func
    return SimpleNamespace(**bound)
