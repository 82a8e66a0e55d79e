"""The Win32 functions of the fence (WFP management, the loopback exemption list, named pipes,
processes, the service control manager), bound like api.py's on first use and only on Windows,
each checking its own result (OSError with `winerror`). The functions WFP answers with a
status its caller must tell apart (FWP_E_ALREADY_EXISTS, FWP_E_FILTER_NOT_FOUND) return it.

Every signature is checked against mingw-w64's headers and import libraries
(tests/test_windows_wfp.py) but NetworkIsolationGetAppContainerConfig and
NetworkIsolationSetAppContainerConfig (FirewallAPI.dll), which mingw-w64 neither declares nor
links: theirs are Microsoft's documented ones, `DWORD (DWORD *, PSID_AND_ATTRIBUTES *)` and
`DWORD (DWORD, PSID_AND_ATTRIBUTES)`.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from types import SimpleNamespace

from stockade.windows.api import _handle, _status, _true, win32
from stockade.windows.fwpstructs import (
    BOOL,
    DWORD,
    FILETIME,
    FWPM_FILTER0,
    FWPM_PROVIDER0,
    FWPM_SESSION0,
    FWPM_SUBLAYER0,
    GUID,
    PVOID,
    SERVICE_STATUS,
    SERVICE_TABLE_ENTRYW,
    UINT64,
)
from stockade.windows.structs import SECURITY_ATTRIBUTES, SID_AND_ATTRIBUTES

LPCWSTR = ctypes.c_wchar_p
_P = ctypes.POINTER

# Named pipes (winbase.h), process access, impersonation levels a client allows (winbase.h).
PIPE_ACCESS_DUPLEX = 0x00000003
FILE_FLAG_FIRST_PIPE_INSTANCE = 0x00080000
PIPE_REJECT_REMOTE_CLIENTS = 0x00000008  # PIPE_TYPE_BYTE | PIPE_READMODE_BYTE | PIPE_WAIT: 0
PIPE_UNLIMITED_INSTANCES = 255
ERROR_BROKEN_PIPE = 109
ERROR_PIPE_BUSY = 231
ERROR_PIPE_CONNECTED = 535
FILE_READ_DATA = 0x0001
FILE_WRITE_DATA = 0x0002
SYNCHRONIZE = 0x00100000
SECURITY_SQOS_PRESENT = 0x00100000
SECURITY_IDENTIFICATION = 0x00010000  # SecurityIdentification << 16
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
TOKEN_INTEGRITY_LEVEL = 25  # TokenIntegrityLevel
# WFP (fwpmtypes.h, winerror.h, rpcdce.h)
RPC_C_AUTHN_WINNT = 10
FWP_E_FILTER_NOT_FOUND = 0x80320003
FWP_E_PROVIDER_NOT_FOUND = 0x80320005
FWP_E_SUBLAYER_NOT_FOUND = 0x80320007
FWP_E_ALREADY_EXISTS = 0x80320009
FWP_E_IN_USE = 0x8032000A
# Services (winsvc.h)
SERVICE_WIN32_OWN_PROCESS = 0x00000010
SERVICE_STOPPED = 1
SERVICE_START_PENDING = 2
SERVICE_STOP_PENDING = 3
SERVICE_RUNNING = 4
SERVICE_ACCEPT_STOP = 0x00000001
SERVICE_ACCEPT_SHUTDOWN = 0x00000004
SERVICE_CONTROL_STOP = 1
SERVICE_CONTROL_INTERROGATE = 4
SERVICE_CONTROL_SHUTDOWN = 5
ERROR_CALL_NOT_IMPLEMENTED = 120

DLLS = ("fwpuclnt", "firewallapi", "kernel32", "advapi32")
# name: (dll, restype, argtypes, errcheck or None)
SIGNATURES: dict[str, tuple[str, object, list, Callable | None]] = {
    # fwpuclnt
    "FwpmEngineOpen0": ("fwpuclnt", DWORD, [LPCWSTR, DWORD, PVOID, _P(FWPM_SESSION0),
                                            _P(ctypes.c_void_p)], _status),
    "FwpmEngineClose0": ("fwpuclnt", DWORD, [ctypes.c_void_p], _status),
    "FwpmTransactionBegin0": ("fwpuclnt", DWORD, [ctypes.c_void_p, DWORD], _status),
    "FwpmTransactionCommit0": ("fwpuclnt", DWORD, [ctypes.c_void_p], _status),
    "FwpmTransactionAbort0": ("fwpuclnt", DWORD, [ctypes.c_void_p], _status),
    "FwpmProviderAdd0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(FWPM_PROVIDER0), PVOID], None),
    "FwpmProviderDeleteByKey0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(GUID)], None),
    "FwpmSubLayerAdd0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(FWPM_SUBLAYER0), PVOID], None),
    "FwpmSubLayerDeleteByKey0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(GUID)], None),
    "FwpmFilterAdd0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(FWPM_FILTER0), PVOID,
                                           _P(UINT64)], _status),
    "FwpmFilterDeleteByKey0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(GUID)], None),
    "FwpmFilterGetByKey0": ("fwpuclnt", DWORD, [ctypes.c_void_p, _P(GUID),
                                                _P(_P(FWPM_FILTER0))], None),
    "FwpmFreeMemory0": ("fwpuclnt", None, [_P(ctypes.c_void_p)], None),
    # firewallapi (Microsoft's documented signatures: mingw-w64 has neither)
    "NetworkIsolationGetAppContainerConfig": ("firewallapi", DWORD, [
        _P(DWORD), _P(_P(SID_AND_ATTRIBUTES))], _status),
    "NetworkIsolationSetAppContainerConfig": ("firewallapi", DWORD, [
        DWORD, _P(SID_AND_ATTRIBUTES)], _status),
    # kernel32
    "GetProcessHeap": ("kernel32", ctypes.c_void_p, [], _true),
    "HeapFree": ("kernel32", BOOL, [ctypes.c_void_p, DWORD, PVOID], _true),
    "CreateNamedPipeW": ("kernel32", ctypes.c_void_p, [LPCWSTR, DWORD, DWORD, DWORD, DWORD,
                                                       DWORD, DWORD, _P(SECURITY_ATTRIBUTES)],
                         _handle),
    "ConnectNamedPipe": ("kernel32", BOOL, [ctypes.c_void_p, PVOID], None),
    "DisconnectNamedPipe": ("kernel32", BOOL, [ctypes.c_void_p], _true),
    "GetNamedPipeClientProcessId": ("kernel32", BOOL, [ctypes.c_void_p, _P(DWORD)], _true),
    "GetNamedPipeServerProcessId": ("kernel32", BOOL, [ctypes.c_void_p, _P(DWORD)], _true),
    "WaitNamedPipeW": ("kernel32", BOOL, [LPCWSTR, DWORD], None),
    "OpenProcess": ("kernel32", ctypes.c_void_p, [DWORD, BOOL, DWORD], _true),
    "GetProcessTimes": ("kernel32", BOOL, [ctypes.c_void_p, _P(FILETIME), _P(FILETIME),
                                           _P(FILETIME), _P(FILETIME)], _true),
    "GetSystemTimeAsFileTime": ("kernel32", None, [_P(FILETIME)], None),
    "K32EnumProcesses": ("kernel32", BOOL, [_P(DWORD), DWORD, _P(DWORD)], _true),
    # advapi32
    "IsTokenRestricted": ("advapi32", BOOL, [ctypes.c_void_p], None),
    "StartServiceCtrlDispatcherW": ("advapi32", BOOL, [_P(SERVICE_TABLE_ENTRYW)], _true),
    "RegisterServiceCtrlHandlerExW": ("advapi32", ctypes.c_void_p, [LPCWSTR, PVOID, PVOID],
                                      _true),
    "SetServiceStatus": ("advapi32", BOOL, [ctypes.c_void_p, _P(SERVICE_STATUS)], _true),
}


@functools.cache
def fence_win32() -> SimpleNamespace:
    """The bound functions; UnavailableError anywhere but Windows (as api.win32)."""
    win32()  # (the platform check, and the backend's own DLLs)
    dlls = {name: ctypes.WinDLL(name, use_last_error=True) for name in DLLS}
    bound = {}
    for name, (dll, restype, argtypes, errcheck) in SIGNATURES.items():
        function = getattr(dlls[dll], name)
        function.restype, function.argtypes = restype, argtypes
        if errcheck is not None:
            function.errcheck = errcheck
        bound[name] = function
    return SimpleNamespace(**bound)


def now() -> int:
    """The system time as a FILETIME integer (100 ns since 1601), as GetProcessTimes gives a
    process's creation time."""
    moment = FILETIME()
    fence_win32().GetSystemTimeAsFileTime(ctypes.byref(moment))
    return filetime(moment)


def filetime(value: FILETIME) -> int:
    return value.dwHighDateTime << 32 | value.dwLowDateTime
