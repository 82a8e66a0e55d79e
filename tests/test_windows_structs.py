"""ctypes layouts against the documented x64 sizes and field offsets, and constants against
their documented values (the Windows SDK headers)."""

from __future__ import annotations

import ctypes

import pytest

from stockade.windows import constants as c
from stockade.windows import structs as s

pytestmark = pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8,
                                reason="the documented layouts checked here are the x64 ones")

LAYOUTS = {
    s.SECURITY_ATTRIBUTES: (24, {"nLength": 0, "lpSecurityDescriptor": 8, "bInheritHandle": 16}),
    s.SID_AND_ATTRIBUTES: (16, {"Sid": 0, "Attributes": 8}),
    s.SECURITY_DESCRIPTOR_RELATIVE: (20, {"Revision": 0, "Sbz1": 1, "Control": 2, "Owner": 4,
                                          "Group": 8, "Sacl": 12, "Dacl": 16}),
    s.SECURITY_CAPABILITIES: (24, {"AppContainerSid": 0, "Capabilities": 8,
                                   "CapabilityCount": 16, "Reserved": 20}),
    s.TOKEN_APPCONTAINER_INFORMATION: (8, {"TokenAppContainer": 0}),
    s.STARTUPINFOW: (104, {"cb": 0, "lpReserved": 8, "lpDesktop": 16, "lpTitle": 24, "dwX": 32,
                           "dwY": 36, "dwXSize": 40, "dwYSize": 44, "dwXCountChars": 48,
                           "dwYCountChars": 52, "dwFillAttribute": 56, "dwFlags": 60,
                           "wShowWindow": 64, "cbReserved2": 66, "lpReserved2": 72,
                           "hStdInput": 80, "hStdOutput": 88, "hStdError": 96}),
    s.STARTUPINFOEXW: (112, {"StartupInfo": 0, "lpAttributeList": 104}),
    s.PROCESS_INFORMATION: (24, {"hProcess": 0, "hThread": 8, "dwProcessId": 16,
                                 "dwThreadId": 20}),
    s.JOBOBJECT_BASIC_LIMIT_INFORMATION: (64, {
        "PerProcessUserTimeLimit": 0, "PerJobUserTimeLimit": 8, "LimitFlags": 16,
        "MinimumWorkingSetSize": 24, "MaximumWorkingSetSize": 32, "ActiveProcessLimit": 40,
        "Affinity": 48, "PriorityClass": 56, "SchedulingClass": 60}),
    s.IO_COUNTERS: (48, {"ReadOperationCount": 0, "OtherTransferCount": 40}),
    s.JOBOBJECT_EXTENDED_LIMIT_INFORMATION: (144, {
        "BasicLimitInformation": 0, "IoInfo": 64, "ProcessMemoryLimit": 112,
        "JobMemoryLimit": 120, "PeakProcessMemoryUsed": 128, "PeakJobMemoryUsed": 136}),
    s.JOBOBJECT_BASIC_UI_RESTRICTIONS: (4, {"UIRestrictionsClass": 0}),
    s.JOBOBJECT_CPU_RATE_CONTROL_INFORMATION: (8, {"ControlFlags": 0, "CpuRate": 4}),
    s.JOBOBJECT_BASIC_ACCOUNTING_INFORMATION: (48, {
        "TotalUserTime": 0, "ThisPeriodTotalKernelTime": 24, "TotalPageFaultCount": 32,
        "TotalProcesses": 36, "ActiveProcesses": 40, "TotalTerminatedProcesses": 44}),
    s.PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY: (4, {"Flags": 0}),
    s.PROCESS_MITIGATION_IMAGE_LOAD_POLICY: (4, {"Flags": 0}),
    s.FILETIME: (8, {"dwLowDateTime": 0, "dwHighDateTime": 4}),
    s.BY_HANDLE_FILE_INFORMATION: (52, {
        "dwFileAttributes": 0, "ftCreationTime": 4, "ftLastAccessTime": 12,
        "ftLastWriteTime": 20, "dwVolumeSerialNumber": 28, "nFileSizeHigh": 32,
        "nFileSizeLow": 36, "nNumberOfLinks": 40, "nFileIndexHigh": 44, "nFileIndexLow": 48}),
    s.FILE_DISPOSITION_INFO: (1, {"DeleteFile": 0}),
    s.PROCESS_BASIC_INFORMATION: (48, {
        "ExitStatus": 0, "PebBaseAddress": 8, "AffinityMask": 16, "BasePriority": 24,
        "UniqueProcessId": 32, "InheritedFromUniqueProcessId": 40}),
}


@pytest.mark.parametrize("structure", list(LAYOUTS), ids=lambda t: t.__name__)
def test_structures_have_the_documented_x64_layout(structure):
    size, offsets = LAYOUTS[structure]
    assert ctypes.sizeof(structure) == size
    assert {name: getattr(structure, name).offset for name in offsets} == offsets


CONSTANTS = {
    "CREATE_SUSPENDED": 0x4, "DETACHED_PROCESS": 0x8, "CREATE_UNICODE_ENVIRONMENT": 0x400,
    "EXTENDED_STARTUPINFO_PRESENT": 0x80000, "STARTF_USESTDHANDLES": 0x100,
    "PROC_THREAD_ATTRIBUTE_HANDLE_LIST": 0x20002,
    "PROC_THREAD_ATTRIBUTE_MITIGATION_POLICY": 0x20007,
    "PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES": 0x20009,
    "PROC_THREAD_ATTRIBUTE_JOB_LIST": 0x2000D,
    "MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON": 4294967296,
    "MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON": 4503599627370496,
    "MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON": 72057594037927936,
    "JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION": 1,
    "JOB_OBJECT_BASIC_UI_RESTRICTIONS": 4, "JOB_OBJECT_EXTENDED_LIMIT_INFORMATION": 9,
    "JOB_OBJECT_LIMIT_BREAKAWAY_OK": 0x800, "JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK": 0x1000,
    "PROCESS_EXTENSION_POINT_DISABLE_POLICY": 6, "PROCESS_IMAGE_LOAD_POLICY": 10,
    "EXTENSION_POINTS_DISABLED": 0x1, "IMAGE_NO_REMOTE": 0x1, "IMAGE_NO_LOW_LABEL": 0x2,
    "WRITE_DAC": 0x40000, "WINSTA_READATTRIBUTES": 0x2, "WINSTA_ACCESSGLOBALATOMS": 0x20,
    "SE_WINDOW_OBJECT": 7, "ERROR_FILE_NOT_FOUND": 2, "ERROR_ACCESS_DENIED": 5,
    "ERROR_INVALID_HANDLE": 6,
    "HRESULT_PATH_NOT_FOUND": 0x80070003,
    "JOB_OBJECT_CPU_RATE_CONTROL_INFORMATION": 15,
    "JOB_OBJECT_LIMIT_ACTIVE_PROCESS": 0x8, "JOB_OBJECT_LIMIT_JOB_MEMORY": 0x200,
    "JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION": 0x400,
    "JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE": 0x2000, "JOB_OBJECT_UILIMIT_ALL": 0xFF,
    "JOB_OBJECT_CPU_RATE_CONTROL_ENABLE": 0x1, "JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP": 0x4,
    "DELETE": 0x10000, "READ_CONTROL": 0x20000, "GENERIC_ALL": 0x10000000,
    "GENERIC_READ": 0x80000000, "GENERIC_WRITE": 0x40000000, "GENERIC_EXECUTE": 0x20000000,
    "FILE_GENERIC_READ": 0x120089, "FILE_GENERIC_WRITE": 0x120116,
    "FILE_GENERIC_EXECUTE": 0x1200A0, "FILE_ALL_ACCESS": 0x1F01FF,
    "FILE_EXECUTE": 0x20, "FILE_GENERIC_READ_EXECUTE": 0x1200A9, "FILE_MODIFY": 0x1301BF,
    "DESKTOP_READOBJECTS": 0x1, "DESKTOP_CREATEWINDOW": 0x2, "DESKTOP_CREATEMENU": 0x4,
    "DESKTOP_WRITEOBJECTS": 0x80, "TOKEN_QUERY": 0x8,
    "SE_FILE_OBJECT": 1, "DACL_SECURITY_INFORMATION": 0x4,
    "UNPROTECTED_DACL_SECURITY_INFORMATION": 0x20000000,
    "PROTECTED_DACL_SECURITY_INFORMATION": 0x80000000, "SE_DACL_PROTECTED": 0x1000,
    "SE_DACL_PRESENT": 0x0004, "SE_DACL_AUTO_INHERITED": 0x0400, "SE_SELF_RELATIVE": 0x8000,
    "SECURITY_DESCRIPTOR_REVISION": 1,
    "SDDL_REVISION_1": 1, "SE_GROUP_ENABLED": 4, "TOKEN_USER": 1, "TOKEN_SESSION_ID": 12,
    "TOKEN_ELEVATION": 20, "TOKEN_IS_APP_CONTAINER": 29,
    "TOKEN_CAPABILITIES": 30, "TOKEN_APP_CONTAINER_SID": 31,
    "FILE_ATTRIBUTE_REPARSE_POINT": 0x400,
    "FILE_SHARE_READ": 0x1, "FILE_SHARE_WRITE": 0x2, "FILE_SHARE_DELETE": 0x4, "OPEN_EXISTING": 3,
    "FILE_FLAG_BACKUP_SEMANTICS": 0x2000000, "FILE_FLAG_OPEN_REPARSE_POINT": 0x200000,
    "FILE_READ_ATTRIBUTES": 0x80, "FSCTL_GET_REPARSE_POINT": 0x900A8,
    "FILE_WRITE_ATTRIBUTES": 0x100, "FSCTL_SET_REPARSE_POINT": 0x900A4,
    "FSCTL_DELETE_REPARSE_POINT": 0x900AC, "ERROR_DLL_INIT_FAILED": 1114,
    "MAXIMUM_REPARSE_DATA_BUFFER_SIZE": 16384, "IO_REPARSE_TAG_MOUNT_POINT": 0xA0000003,
    "IO_REPARSE_TAG_SYMLINK": 0xA000000C, "IO_REPARSE_TAG_APPEXECLINK": 0x8000001B,
    "IO_REPARSE_TAG_CLOUD": 0x9000001A, "IO_REPARSE_TAG_CLOUD_MASK": 0xF000,
    "IO_REPARSE_TAG_WOF": 0x80000017, "IO_REPARSE_TAG_DEDUP": 0x80000013,
    "DUPLICATE_SAME_ACCESS": 0x2, "WAIT_OBJECT_0": 0, "UOI_NAME": 2,
    "ERROR_ALREADY_EXISTS": 183, "ERROR_INSUFFICIENT_BUFFER": 122, "ERROR_BAD_LENGTH": 24,
    "HRESULT_ALREADY_EXISTS": 0x800700B7, "HRESULT_FILE_NOT_FOUND": 0x80070002,
    "HRESULT_NOT_FOUND": 0x80070490,
    # the broker (issue 36): its manifest file, the child it made, the Job handle it gets
    "FILE_ATTRIBUTE_DIRECTORY": 0x10, "FILE_ATTRIBUTE_NORMAL": 0x80, "CREATE_NEW": 1,
    "FILE_FLAG_DELETE_ON_CLOSE": 0x4000000, "ERROR_PATH_NOT_FOUND": 3,
    "ERROR_SHARING_VIOLATION": 32, "ERROR_FILE_EXISTS": 80, "SYNCHRONIZE": 0x100000,
    "PROCESS_DUP_HANDLE": 0x40, "PROCESS_QUERY_INFORMATION": 0x400,
    "THREAD_SUSPEND_RESUME": 0x2, "JOB_OBJECT_ASSIGN_PROCESS": 0x1,
    "PROCESS_BASIC_INFORMATION_CLASS": 0,
    # what a reconcile asks of a recorded process, and how it deletes a manifest left behind
    "PROCESS_QUERY_LIMITED_INFORMATION": 0x1000, "PROCESS_TERMINATE": 0x1,
    "ERROR_INVALID_PARAMETER": 87, "STILL_ACTIVE": 259, "FILE_DISPOSITION_INFO_CLASS": 4,
}


def test_constants_have_their_documented_values():
    assert {name: getattr(c, name) for name in CONSTANTS} == CONSTANTS


def test_every_constant_is_pinned_by_this_test():
    defined = {name for name in vars(c) if name.isupper()}
    assert defined == set(CONSTANTS)


def test_file_rights_are_the_documented_combinations():
    file_generic_read = 0x120089  # READ_CONTROL | SYNCHRONIZE | read data, attributes, EA
    file_generic_execute = 0x1200A0  # READ_CONTROL | SYNCHRONIZE | execute, read attributes
    file_generic_write = 0x120116
    assert c.FILE_GENERIC_READ_EXECUTE == file_generic_read | file_generic_execute
    assert c.FILE_MODIFY == file_generic_read | file_generic_write | file_generic_execute \
        | c.DELETE


def test_attribute_values_are_their_numbers_marked_as_input():
    # ProcThreadAttributeValue(number, thread=False, input=True, additive=False)
    for name, number in (("HANDLE_LIST", 2), ("MITIGATION_POLICY", 7),
                         ("SECURITY_CAPABILITIES", 9), ("JOB_LIST", 13)):
        assert getattr(c, f"PROC_THREAD_ATTRIBUTE_{name}") == number | 0x20000


# Parameter counts of the bound functions, from their documented prototypes.
ARITY = {
    "CreateAppContainerProfile": 6, "DeleteAppContainerProfile": 1,
    "DeriveAppContainerSidFromAppContainerName": 2, "ConvertSidToStringSidW": 2,
    "ConvertStringSecurityDescriptorToSecurityDescriptorW": 4, "FreeSid": 1,
    "GetNamedSecurityInfoW": 8, "GetSecurityDescriptorControl": 3,
    "OpenProcessToken": 3, "GetTokenInformation": 5, "CloseHandle": 1, "CreateJobObjectW": 2,
    "SetInformationJobObject": 4, "TerminateJobObject": 2, "IsProcessInJob": 3,
    "InitializeProcThreadAttributeList": 4, "UpdateProcThreadAttribute": 7,
    "DeleteProcThreadAttributeList": 1, "CreateProcessW": 10, "ResumeThread": 1,
    "WaitForSingleObject": 2, "GetExitCodeProcess": 2, "GetCurrentProcess": 0, "GetTickCount64": 0,
    "DuplicateHandle": 7, "CreateMutexW": 3, "LocalFree": 1, "GetLongPathNameW": 3,
    "CreateFileW": 7, "GetVolumePathNameW": 3, "GetVolumeInformationW": 8, "CreateDesktopExW": 8,
    "FindFirstFileNameW": 4, "FindNextFileNameW": 3, "FindClose": 1,
    "CloseDesktop": 1, "GetProcessWindowStation": 0, "GetUserObjectInformationW": 5,
    "GetAppContainerFolderPath": 2, "CoTaskMemFree": 1, "GetSecurityInfo": 8,
    "SetSecurityInfo": 7, "QueryInformationJobObject": 5, "GetProcessMitigationPolicy": 4,
    "CreateEventW": 4, "CompareObjectHandles": 2, "OpenWindowStationW": 3,
    "CloseWindowStation": 1, "DeviceIoControl": 8,
    "SetKernelObjectSecurity": 3, "ReadFile": 5, "WriteFile": 5, "FlushFileBuffers": 1,
    "GetFileInformationByHandle": 2, "OpenProcess": 3, "OpenThread": 3,
    "NtQueryInformationProcess": 5, "GetProcessTimes": 5, "TerminateProcess": 2,
    "SetFileInformationByHandle": 4,
}


def test_bound_functions_take_their_documented_number_of_parameters():
    from stockade.windows.api import _SIGNATURES

    assert {name: len(sig[2]) for name, sig in _SIGNATURES.items()} == ARITY


def test_hresult_failures_raise_with_the_hresult_as_winerror():
    from stockade.windows.api import _hresult

    def DeleteAppContainerProfile():  # noqa: N802 -- named as the function it stands for
        pass

    assert _hresult(0, DeleteAppContainerProfile, ()) == 0
    with pytest.raises(OSError) as failed:
        _hresult(-2147024891, DeleteAppContainerProfile, ())  # E_ACCESSDENIED, signed
    assert failed.value.winerror == 0x80070005
    assert "DeleteAppContainerProfile" in str(failed.value)
