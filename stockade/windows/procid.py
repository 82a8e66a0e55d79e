"""A Windows process named by its identity: its id and its creation time (GetProcessTimes, a
FILETIME: 100 ns since 1601). An id alone names a later process once the first has ended and
every handle to it is closed; the pair never does on one host. The ledger records processes
Stockade starts by this pair (the broker a manifest is for, manifestfile.py; a Windows Sandbox's
WindowsSandbox.exe, stockade/vm/wsb_ledger.py), so that a reconcile acts on the very process
recorded and never on one that only has its id.

- `created(pid)`: the creation time, asked while holding a handle to the process (its Popen):
  then the id cannot name another meanwhile;
- `running(pid, created)`: whether that process still runs (one that has ended, while a handle
  keeps its object, does not);
- `end(pid, created)`: end that process and wait for it (bounded); whether it is gone.

Whichever process has the id is first opened for PROCESS_QUERY_LIMITED_INFORMATION alone, the
right Windows grants most widely, and only the recorded one is opened to be ended (while the
first handle is held, the id cannot name another). A process that cannot be opened even so
(ERROR_ACCESS_DENIED: another user's) is neither running nor gone: the OSError is raised, and a
ledger reconcile keeps the record for the next.
"""

from __future__ import annotations

import ctypes

from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.structs import DWORD, FILETIME

END_WAIT = 5.0  # seconds for a process to be gone once terminated
ENDED = 1  # the exit code of a process ended here


def created(pid: int) -> int:
    """The creation time of process `pid` (hold a handle to it while asking)."""
    handle = win32().OpenProcess(c.PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    try:
        return _created(handle)
    finally:
        win32().CloseHandle(handle)


def running(pid: int, created: int) -> bool:
    """Whether the process `pid` created at `created` still runs."""
    handle = _open(pid)
    if handle is None:
        return False
    try:
        return _created(handle) == created and _active(handle)
    finally:
        win32().CloseHandle(handle)


def end(pid: int, created: int) -> bool:
    """End the process `pid` created at `created`, if it runs; whether it is gone. A process
    that only has its id is left alone (and the recorded one is gone)."""
    handle = _open(pid)
    if handle is None:
        return True
    try:
        if _created(handle) != created or not _active(handle):
            return True
        api = win32()
        ender = api.OpenProcess(c.PROCESS_TERMINATE | c.SYNCHRONIZE, False, pid)  # (the same)
        try:
            try:
                api.TerminateProcess(ender, ENDED)
            except OSError:
                pass  # (it ended meanwhile: access denied to a process that is exiting)
            return api.WaitForSingleObject(ender, int(END_WAIT * 1000)) == c.WAIT_OBJECT_0
        finally:
            api.CloseHandle(ender)
    finally:
        win32().CloseHandle(handle)


def _open(pid: int) -> int | None:
    """A handle to process `pid` to query it, or None if no process has that id."""
    try:
        return win32().OpenProcess(c.PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    except OSError as exc:
        if exc.winerror == c.ERROR_INVALID_PARAMETER:
            return None
        raise


def _created(handle: int) -> int:
    times = [FILETIME() for _ in range(4)]  # creation, exit, kernel, user
    win32().GetProcessTimes(handle, *(ctypes.byref(t) for t in times))
    return times[0].dwHighDateTime << 32 | times[0].dwLowDateTime


def _active(handle: int) -> bool:
    """Whether the process has not ended (an exit code of STILL_ACTIVE itself is read as not
    ended: kept, never taken for gone)."""
    code = DWORD()
    win32().GetExitCodeProcess(handle, ctypes.byref(code))
    return code.value == c.STILL_ACTIVE
