"""The Win32 functions the backend calls, bound with ctypes on first use and only on Windows.

`win32()` returns a namespace of functions with their documented signatures; each checks its own
result and raises OSError (with `winerror` set) on failure, so callers never test return codes.
On another platform `win32()` raises UnavailableError (`backend_unavailable`). A user with no
access to the window station and desktop it was started on cannot load user32.dll: its
initialisation connects the process to them and fails (ERROR_DLL_INIT_FAILED; a program started
so fails with 0xC0000142). That is `window_station_denied`, with what to do, not a missing
function.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from types import SimpleNamespace

from stockade.errors import SetupError, UnavailableError
from stockade.windows import constants as c
from stockade.windows.structs import (
    BOOL,
    BY_HANDLE_FILE_INFORMATION,
    DWORD,
    FILETIME,
    HANDLE,
    LONG,
    PROCESS_BASIC_INFORMATION,
    PROCESS_INFORMATION,
    PSID,
    PVOID,
    SECURITY_ATTRIBUTES,
    SIZE_T,
    STARTUPINFOEXW,
    ULONG_PTR,
    WORD,
)

LPCWSTR = ctypes.c_wchar_p
_P = ctypes.POINTER


def _fail(code: int, name: str) -> OSError:
    error: OSError = ctypes.WinError(code)
    error.strerror = f"{name}: {error.strerror}"
    return error


def _true(result, func, args):
    if not result:
        raise _fail(ctypes.get_last_error(), func.__name__)
    return result


def _handle(result, func, args):
    """Functions returning INVALID_HANDLE_VALUE on failure."""
    if result is None or result == _INVALID_HANDLE:
        raise _fail(ctypes.get_last_error(), func.__name__)
    return result


_INVALID_HANDLE = ctypes.c_void_p(-1).value


def _status(result, func, args):
    """Functions returning a Win32 error code (ERROR_SUCCESS is 0)."""
    if result:
        raise _fail(result, func.__name__)
    return result


def _hresult(result, func, args):
    """Functions returning an HRESULT; the OSError's winerror is the HRESULT itself."""
    if result & 0xFFFFFFFF:
        error = OSError(None, f"{func.__name__}: HRESULT 0x{result & 0xFFFFFFFF:08X}")
        error.winerror = result & 0xFFFFFFFF
        raise error
    return result


def _ntstatus(result, func, args):
    """Native functions returning an NTSTATUS (0 is success); its winerror is the status."""
    if result:
        error = OSError(None, f"{func.__name__}: NTSTATUS 0x{result & 0xFFFFFFFF:08X}")
        error.winerror = result & 0xFFFFFFFF
        raise error
    return result


def _wait(result, func, args):
    if result == 0xFFFFFFFF:  # WAIT_FAILED
        raise _fail(ctypes.get_last_error(), func.__name__)
    return result


DLLS = ("userenv", "ole32", "advapi32", "kernel32", "kernelbase", "user32", "ntdll")
# name: (dll, restype, argtypes, errcheck or None)
_SIGNATURES: dict[str, tuple[str, object, list, Callable | None]] = {
    # userenv
    "CreateAppContainerProfile": ("userenv", ctypes.c_long,
                                  [LPCWSTR, LPCWSTR, LPCWSTR, PVOID, DWORD, _P(PSID)], None),
    "DeleteAppContainerProfile": ("userenv", ctypes.c_long, [LPCWSTR], None),
    "DeriveAppContainerSidFromAppContainerName": ("userenv", ctypes.c_long,
                                                  [LPCWSTR, _P(PSID)], _hresult),
    "GetAppContainerFolderPath": ("userenv", ctypes.c_long, [LPCWSTR, _P(PVOID)], None),
    # ole32
    "CoTaskMemFree": ("ole32", None, [PVOID], None),
    # advapi32
    "ConvertSidToStringSidW": ("advapi32", BOOL, [PSID, _P(ctypes.c_wchar_p)], _true),
    "ConvertStringSecurityDescriptorToSecurityDescriptorW": (
        "advapi32", BOOL, [LPCWSTR, DWORD, _P(PVOID), _P(ctypes.c_ulong)], _true),
    "FreeSid": ("advapi32", PVOID, [PSID], None),
    "GetNamedSecurityInfoW": ("advapi32", DWORD, [LPCWSTR, ctypes.c_int, DWORD, _P(PSID),
                                                  _P(PSID), _P(PVOID), _P(PVOID), _P(PVOID)],
                              _status),
    "GetSecurityInfo": ("advapi32", DWORD, [HANDLE, ctypes.c_int, DWORD, _P(PSID), _P(PSID),
                                            _P(PVOID), _P(PVOID), _P(PVOID)], _status),
    "SetSecurityInfo": ("advapi32", DWORD, [HANDLE, ctypes.c_int, DWORD, PSID, PSID, PVOID,
                                            PVOID], _status),
    "GetSecurityDescriptorControl": ("advapi32", BOOL, [PVOID, _P(WORD), _P(DWORD)], _true),
    "SetKernelObjectSecurity": ("advapi32", BOOL, [HANDLE, DWORD, PVOID], _true),
    "OpenProcessToken": ("advapi32", BOOL, [HANDLE, DWORD, _P(HANDLE)], _true),
    "GetTokenInformation": ("advapi32", BOOL, [HANDLE, ctypes.c_int, PVOID, DWORD, _P(DWORD)],
                            _true),
    # kernel32
    "CloseHandle": ("kernel32", BOOL, [HANDLE], _true),
    "CreateJobObjectW": ("kernel32", HANDLE, [_P(SECURITY_ATTRIBUTES), LPCWSTR], _true),
    "SetInformationJobObject": ("kernel32", BOOL, [HANDLE, ctypes.c_int, PVOID, DWORD], _true),
    "QueryInformationJobObject": ("kernel32", BOOL, [HANDLE, ctypes.c_int, PVOID, DWORD,
                                                     _P(DWORD)], _true),
    "GetProcessMitigationPolicy": ("kernel32", BOOL, [HANDLE, ctypes.c_int, PVOID, SIZE_T],
                                   _true),
    "CreateEventW": ("kernel32", HANDLE, [_P(SECURITY_ATTRIBUTES), BOOL, BOOL, LPCWSTR], _true),
    "TerminateJobObject": ("kernel32", BOOL, [HANDLE, ctypes.c_uint], _true),
    "IsProcessInJob": ("kernel32", BOOL, [HANDLE, HANDLE, _P(BOOL)], _true),
    "InitializeProcThreadAttributeList": ("kernel32", BOOL, [PVOID, DWORD, DWORD, _P(SIZE_T)],
                                          None),
    "UpdateProcThreadAttribute": ("kernel32", BOOL, [PVOID, DWORD, ULONG_PTR, PVOID, SIZE_T,
                                                     PVOID, _P(SIZE_T)], _true),
    "DeleteProcThreadAttributeList": ("kernel32", None, [PVOID], None),
    "CreateProcessW": ("kernel32", BOOL, [LPCWSTR, ctypes.c_wchar_p, PVOID, PVOID, BOOL, DWORD,
                                          PVOID, LPCWSTR, _P(STARTUPINFOEXW),
                                          _P(PROCESS_INFORMATION)], _true),
    "ResumeThread": ("kernel32", DWORD, [HANDLE], None),
    "WaitForSingleObject": ("kernel32", DWORD, [HANDLE, DWORD], _wait),
    "GetExitCodeProcess": ("kernel32", BOOL, [HANDLE, _P(DWORD)], _true),
    "GetCurrentProcess": ("kernel32", HANDLE, [], None),
    "GetTickCount64": ("kernel32", ctypes.c_uint64, [], None),
    "DuplicateHandle": ("kernel32", BOOL, [HANDLE, HANDLE, HANDLE, _P(HANDLE), DWORD, BOOL,
                                           DWORD], _true),
    "CreateMutexW": ("kernel32", HANDLE, [PVOID, BOOL, LPCWSTR], _true),
    # kernelbase (Windows 10 1607 and later)
    "CompareObjectHandles": ("kernelbase", BOOL, [HANDLE, HANDLE], None),
    "LocalFree": ("kernel32", PVOID, [PVOID], None),
    "GetLongPathNameW": ("kernel32", DWORD, [LPCWSTR, ctypes.c_wchar_p, DWORD], _true),
    "CreateFileW": ("kernel32", HANDLE, [LPCWSTR, DWORD, DWORD, _P(SECURITY_ATTRIBUTES), DWORD,
                                         DWORD, HANDLE], _handle),
    "ReadFile": ("kernel32", BOOL, [HANDLE, PVOID, DWORD, _P(DWORD), PVOID], _true),
    "WriteFile": ("kernel32", BOOL, [HANDLE, PVOID, DWORD, _P(DWORD), PVOID], _true),
    "FlushFileBuffers": ("kernel32", BOOL, [HANDLE], _true),
    "GetFileInformationByHandle": ("kernel32", BOOL, [HANDLE, _P(BY_HANDLE_FILE_INFORMATION)],
                                   _true),
    "OpenProcess": ("kernel32", HANDLE, [DWORD, BOOL, DWORD], _true),
    "GetProcessTimes": ("kernel32", BOOL, [HANDLE, _P(FILETIME), _P(FILETIME), _P(FILETIME),
                                           _P(FILETIME)], _true),
    "TerminateProcess": ("kernel32", BOOL, [HANDLE, ctypes.c_uint], _true),
    "SetFileInformationByHandle": ("kernel32", BOOL, [HANDLE, ctypes.c_int, PVOID, DWORD],
                                   _true),
    "OpenThread": ("kernel32", HANDLE, [DWORD, BOOL, DWORD], _true),
    "DeviceIoControl": ("kernel32", BOOL, [HANDLE, DWORD, PVOID, DWORD, PVOID, DWORD, _P(DWORD),
                                           PVOID], _true),
    "FindFirstFileNameW": ("kernel32", HANDLE, [LPCWSTR, DWORD, _P(DWORD), ctypes.c_wchar_p],
                           _handle),
    "FindNextFileNameW": ("kernel32", BOOL, [HANDLE, _P(DWORD), ctypes.c_wchar_p], None),
    "FindClose": ("kernel32", BOOL, [HANDLE], _true),
    "GetVolumePathNameW": ("kernel32", BOOL, [LPCWSTR, ctypes.c_wchar_p, DWORD], _true),
    "GetVolumeInformationW": ("kernel32", BOOL, [LPCWSTR, ctypes.c_wchar_p, DWORD, _P(DWORD),
                                                 _P(DWORD), _P(DWORD), ctypes.c_wchar_p, DWORD],
                              _true),
    # ntdll (documented: the parent of a process, InheritedFromUniqueProcessId)
    "NtQueryInformationProcess": ("ntdll", LONG, [HANDLE, ctypes.c_int,
                                                  _P(PROCESS_BASIC_INFORMATION), DWORD, PVOID],
                                  _ntstatus),
    # user32
    "CreateDesktopExW": ("user32", HANDLE, [LPCWSTR, LPCWSTR, PVOID, DWORD, DWORD,
                                            _P(SECURITY_ATTRIBUTES), ctypes.c_uint32, PVOID],
                         _true),
    "CloseDesktop": ("user32", BOOL, [HANDLE], _true),
    "GetProcessWindowStation": ("user32", HANDLE, [], _true),
    "OpenWindowStationW": ("user32", HANDLE, [LPCWSTR, BOOL, DWORD], _true),
    "CloseWindowStation": ("user32", BOOL, [HANDLE], _true),
    "GetUserObjectInformationW": ("user32", BOOL, [HANDLE, ctypes.c_int, PVOID, DWORD,
                                                   _P(DWORD)], _true),
}


@functools.cache
def station_denied(what: str) -> SetupError:
    """The refusal of a launch whose user may not `what` (see windows/desktop.py)."""
    return SetupError("window_station_denied", f"this user may not {what} (a process started "
                      "under other credentials, by runas or Start-Process -Credential, runs on "
                      "its starter's window station unless told another, and Windows documents "
                      "no entry there letting it change the station or create a desktop); "
                      "run Stockade in the user's own logon session, or "
                      "grant the user access to the window station and desktop first "
                      "(scripts/windows-unelevated.ps1 does)", stage="job_desktop")


def win32() -> SimpleNamespace:
    """The bound functions; UnavailableError anywhere but Windows."""
    if sys.platform != "win32":
        raise UnavailableError("backend_unavailable", "the Windows backend runs only on Windows")
    try:
        dlls = {name: ctypes.WinDLL(name, use_last_error=True) for name in DLLS}
    except OSError as exc:
        if getattr(exc, "winerror", None) != c.ERROR_DLL_INIT_FAILED:
            raise
        raise station_denied("load user32.dll, whose initialisation Windows fails "
                             "(ERROR_DLL_INIT_FAILED) for a process without access to its "
                             "window station and desktop") from None
    bound = {}
    for name, (dll, restype, argtypes, errcheck) in _SIGNATURES.items():
        func = getattr(dlls[dll], name)
        func.restype, func.argtypes = restype, argtypes
        if errcheck is not None:
            func.errcheck = errcheck
        bound[name] = func
    return SimpleNamespace(**bound)


def fresh_last_error() -> None:
    """Clear the saved last-error value, for functions that report through it on success."""
    ctypes.set_last_error(0)


def last_error() -> int:
    return ctypes.get_last_error()
