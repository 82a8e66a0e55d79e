"""Win32 structures as ctypes layouts, built from fixed-width types.

`ctypes.wintypes` maps DWORD and LONG to C `long`, which is 8 bytes on 64-bit Linux; here every
field has the width Windows gives it, so the layouts are the same on every platform and the tests
check them on Linux against the documented x64 sizes and offsets.
"""

from __future__ import annotations

import ctypes

BYTE = ctypes.c_uint8
WORD = ctypes.c_uint16
DWORD = ctypes.c_uint32
DWORD64 = ctypes.c_uint64
BOOL = ctypes.c_int32
LONG = ctypes.c_int32
LARGE_INTEGER = ctypes.c_int64
ULONGLONG = ctypes.c_uint64
SIZE_T = ctypes.c_size_t
ULONG_PTR = ctypes.c_size_t
HANDLE = ctypes.c_void_p
PVOID = ctypes.c_void_p
PSID = ctypes.c_void_p
LPWSTR = ctypes.c_wchar_p


class SECURITY_ATTRIBUTES(ctypes.Structure):
    _fields_ = [("nLength", DWORD), ("lpSecurityDescriptor", PVOID), ("bInheritHandle", BOOL)]


class SID_AND_ATTRIBUTES(ctypes.Structure):
    _fields_ = [("Sid", PSID), ("Attributes", DWORD)]


class SECURITY_CAPABILITIES(ctypes.Structure):
    _fields_ = [("AppContainerSid", PSID),
                ("Capabilities", ctypes.POINTER(SID_AND_ATTRIBUTES)),
                ("CapabilityCount", DWORD),
                ("Reserved", DWORD)]


class TOKEN_APPCONTAINER_INFORMATION(ctypes.Structure):
    _fields_ = [("TokenAppContainer", PSID)]


class STARTUPINFOW(ctypes.Structure):
    _fields_ = [("cb", DWORD), ("lpReserved", LPWSTR), ("lpDesktop", LPWSTR),
                ("lpTitle", LPWSTR), ("dwX", DWORD), ("dwY", DWORD), ("dwXSize", DWORD),
                ("dwYSize", DWORD), ("dwXCountChars", DWORD), ("dwYCountChars", DWORD),
                ("dwFillAttribute", DWORD), ("dwFlags", DWORD), ("wShowWindow", WORD),
                ("cbReserved2", WORD), ("lpReserved2", ctypes.POINTER(BYTE)),
                ("hStdInput", HANDLE), ("hStdOutput", HANDLE), ("hStdError", HANDLE)]


class STARTUPINFOEXW(ctypes.Structure):
    _fields_ = [("StartupInfo", STARTUPINFOW), ("lpAttributeList", PVOID)]


class PROCESS_INFORMATION(ctypes.Structure):
    _fields_ = [("hProcess", HANDLE), ("hThread", HANDLE), ("dwProcessId", DWORD),
                ("dwThreadId", DWORD)]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [("PerProcessUserTimeLimit", LARGE_INTEGER),
                ("PerJobUserTimeLimit", LARGE_INTEGER),
                ("LimitFlags", DWORD),
                ("MinimumWorkingSetSize", SIZE_T),
                ("MaximumWorkingSetSize", SIZE_T),
                ("ActiveProcessLimit", DWORD),
                ("Affinity", ULONG_PTR),
                ("PriorityClass", DWORD),
                ("SchedulingClass", DWORD)]


class IO_COUNTERS(ctypes.Structure):
    _fields_ = [(name, ULONGLONG) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
                ("IoInfo", IO_COUNTERS),
                ("ProcessMemoryLimit", SIZE_T),
                ("JobMemoryLimit", SIZE_T),
                ("PeakProcessMemoryUsed", SIZE_T),
                ("PeakJobMemoryUsed", SIZE_T)]


class JOBOBJECT_BASIC_UI_RESTRICTIONS(ctypes.Structure):
    _fields_ = [("UIRestrictionsClass", DWORD)]


class JOBOBJECT_CPU_RATE_CONTROL_INFORMATION(ctypes.Structure):
    # ControlFlags, then a union whose CpuRate member is the only one used here.
    _fields_ = [("ControlFlags", DWORD), ("CpuRate", DWORD)]


class JOBOBJECT_BASIC_ACCOUNTING_INFORMATION(ctypes.Structure):
    _fields_ = [("TotalUserTime", LARGE_INTEGER), ("TotalKernelTime", LARGE_INTEGER),
                ("ThisPeriodTotalUserTime", LARGE_INTEGER),
                ("ThisPeriodTotalKernelTime", LARGE_INTEGER),
                ("TotalPageFaultCount", DWORD), ("TotalProcesses", DWORD),
                ("ActiveProcesses", DWORD), ("TotalTerminatedProcesses", DWORD)]


class PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY(ctypes.Structure):
    _fields_ = [("Flags", DWORD)]  # a union of Flags and its bit fields


class PROCESS_MITIGATION_IMAGE_LOAD_POLICY(ctypes.Structure):
    _fields_ = [("Flags", DWORD)]  # a union of Flags and its bit fields


class SECURITY_DESCRIPTOR_RELATIVE(ctypes.Structure):
    """A self-relative security descriptor's header; each offset is from its start, 0 for a
    part it does not hold."""

    _fields_ = [("Revision", BYTE), ("Sbz1", BYTE), ("Control", WORD), ("Owner", DWORD),
                ("Group", DWORD), ("Sacl", DWORD), ("Dacl", DWORD)]


class FILETIME(ctypes.Structure):
    _fields_ = [("dwLowDateTime", DWORD), ("dwHighDateTime", DWORD)]


class BY_HANDLE_FILE_INFORMATION(ctypes.Structure):
    _fields_ = [("dwFileAttributes", DWORD), ("ftCreationTime", FILETIME),
                ("ftLastAccessTime", FILETIME), ("ftLastWriteTime", FILETIME),
                ("dwVolumeSerialNumber", DWORD), ("nFileSizeHigh", DWORD),
                ("nFileSizeLow", DWORD), ("nNumberOfLinks", DWORD), ("nFileIndexHigh", DWORD),
                ("nFileIndexLow", DWORD)]


class FILE_DISPOSITION_INFO(ctypes.Structure):
    _fields_ = [("DeleteFile", BYTE)]  # (a BOOLEAN)


class PROCESS_BASIC_INFORMATION(ctypes.Structure):
    _fields_ = [("ExitStatus", LONG), ("PebBaseAddress", PVOID), ("AffinityMask", ULONG_PTR),
                ("BasePriority", LONG), ("UniqueProcessId", ULONG_PTR),
                ("InheritedFromUniqueProcessId", ULONG_PTR)]
