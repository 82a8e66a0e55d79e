"""A model of this host's processes as stockade/windows/procid.py sees them through Win32
(OpenProcess, GetProcessTimes, WaitForSingleObject, TerminateProcess, CloseHandle), behaving as
Microsoft documents them:

- OpenProcess of an id no process has fails with ERROR_INVALID_PARAMETER; a process that has
  ended stays (its id taken) while a handle to it is open, and then answers as ended; one of
  another user fails with ERROR_ACCESS_DENIED;
- an id is handed out again only once its process has ended and no handle to it is open, with
  a later creation time (`start(pid=...)`: the reuse);
- GetProcessTimes gives the creation time (FILETIME); GetExitCodeProcess STILL_ACTIVE until the
  process has ended; WaitForSingleObject (SYNCHRONIZE) is WAIT_OBJECT_0 once it has ended,
  else WAIT_TIMEOUT; TerminateProcess needs PROCESS_TERMINATE and ends it
  (a `stubborn` one does not end), and fails with ERROR_ACCESS_DENIED on one that has
  ended.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from test_windows_fakes import win32_error

from stockade.windows import constants as c

WAIT_TIMEOUT = 0x102


@dataclass(eq=False)
class Process:
    pid: int
    created: int
    running: bool = True
    stubborn: bool = False  # terminating it does not end it
    foreign: bool = False  # another user's: OpenProcess is denied
    terminated: int = 0  # how many times TerminateProcess was called on it


class Processes:
    def __init__(self) -> None:
        self.table: dict[int, Process] = {}
        self.handles: dict[int, tuple[Process, int]] = {}
        self._clock = itertools.count(133_000_000_000_000_000, 10_000_000)
        self._pid = itertools.count(4000, 4)
        self._handle = itertools.count(0x9000, 4)

    def start(self, pid: int | None = None, **flags: bool) -> Process:
        """A new process, given `pid` if that id is free."""
        pid = next(self._pid) if pid is None else pid
        assert pid not in self.table, "an id is reused only once its process is gone"
        self.table[pid] = Process(pid, next(self._clock), **flags)
        return self.table[pid]

    def exit(self, process: Process) -> None:
        process.running = False
        self._reap(process)

    def _reap(self, process: Process) -> None:
        if not process.running and all(p is not process for p, _ in self.handles.values()):
            self.table.pop(process.pid, None)

    # --- Win32 -----------------------------------------------------------------------------------
    def OpenProcess(self, access, inherit, pid):  # noqa: N802
        process = self.table.get(pid)
        if process is None:
            raise win32_error(c.ERROR_INVALID_PARAMETER, "OpenProcess")
        if process.foreign:
            raise win32_error(c.ERROR_ACCESS_DENIED, "OpenProcess")
        handle = next(self._handle)
        self.handles[handle] = (process, access)
        return handle

    def CloseHandle(self, handle):  # noqa: N802
        process, _ = self.handles.pop(handle)
        self._reap(process)
        return 1

    def GetProcessTimes(self, handle, creation, exit, kernel, user):  # noqa: N802
        process, access = self.handles[handle]
        assert access & (c.PROCESS_QUERY_LIMITED_INFORMATION | c.PROCESS_QUERY_INFORMATION)
        creation._obj.dwLowDateTime = process.created & 0xFFFFFFFF
        creation._obj.dwHighDateTime = process.created >> 32
        return 1

    def GetExitCodeProcess(self, handle, code):  # noqa: N802
        process, access = self.handles[handle]
        assert access & (c.PROCESS_QUERY_LIMITED_INFORMATION | c.PROCESS_QUERY_INFORMATION)
        code._obj.value = c.STILL_ACTIVE if process.running else 1
        return 1

    def WaitForSingleObject(self, handle, milliseconds):  # noqa: N802
        process, access = self.handles[handle]
        assert access & c.SYNCHRONIZE
        return WAIT_TIMEOUT if process.running else c.WAIT_OBJECT_0

    def TerminateProcess(self, handle, code):  # noqa: N802
        process, access = self.handles[handle]
        assert access & c.PROCESS_TERMINATE
        if not process.running:
            raise win32_error(c.ERROR_ACCESS_DENIED, "TerminateProcess")
        process.terminated += 1
        process.running = process.stubborn
        return 1
