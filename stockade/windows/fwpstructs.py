"""The Win32 structures of the fence (WFP management, the service control manager, process
times) as ctypes layouts of fixed-width types, like structs.py: the same on every platform, and
checked on Linux against mingw-w64's headers (tests/test_windows_wfp.py).

A C union is written as one of its members that has the union's size and alignment: WFP's
FWP_VALUE0 and FWP_CONDITION_VALUE0 as `uint64` (a UINT64 pointer in C: 8 bytes, which also
holds a UINT8, UINT16 or UINT32 in its low bytes, as a little-endian union does, or any other
member's pointer); FWPM_FILTER0's context as `providerContextKey` (16 bytes, aligned as its
UINT64 sibling); FWPM_ACTION0's as `filterType` (a GUID).
"""

from __future__ import annotations

import ctypes

BYTE = ctypes.c_uint8
WORD = ctypes.c_uint16
DWORD = ctypes.c_uint32
UINT64 = ctypes.c_uint64
BOOL = ctypes.c_int32
PVOID = ctypes.c_void_p
LPWSTR = ctypes.c_wchar_p


class GUID(ctypes.Structure):
    _fields_ = [("Data1", DWORD), ("Data2", WORD), ("Data3", WORD), ("Data4", BYTE * 8)]


class FWPM_DISPLAY_DATA0(ctypes.Structure):
    _fields_ = [("name", LPWSTR), ("description", LPWSTR)]


class FWP_BYTE_BLOB(ctypes.Structure):
    _fields_ = [("size", DWORD), ("data", PVOID)]


class FWP_VALUE0(ctypes.Structure):
    _fields_ = [("type", DWORD), ("uint64", UINT64)]


class FWP_CONDITION_VALUE0(ctypes.Structure):
    _fields_ = [("type", DWORD), ("uint64", UINT64)]


class FWP_V4_ADDR_AND_MASK(ctypes.Structure):
    _fields_ = [("addr", DWORD), ("mask", DWORD)]


class FWP_V6_ADDR_AND_MASK(ctypes.Structure):
    _fields_ = [("addr", BYTE * 16), ("prefixLength", BYTE)]


class FWPM_FILTER_CONDITION0(ctypes.Structure):
    _fields_ = [("fieldKey", GUID), ("matchType", DWORD),
                ("conditionValue", FWP_CONDITION_VALUE0)]


class FWPM_ACTION0(ctypes.Structure):
    _fields_ = [("type", DWORD), ("filterType", GUID)]


class FWPM_FILTER0(ctypes.Structure):
    _fields_ = [("filterKey", GUID), ("displayData", FWPM_DISPLAY_DATA0), ("flags", DWORD),
                ("providerKey", PVOID), ("providerData", FWP_BYTE_BLOB), ("layerKey", GUID),
                ("subLayerKey", GUID), ("weight", FWP_VALUE0), ("numFilterConditions", DWORD),
                ("filterCondition", PVOID), ("action", FWPM_ACTION0),
                ("providerContextKey", UINT64 * 2), ("reserved", PVOID), ("filterId", UINT64),
                ("effectiveWeight", FWP_VALUE0)]


class FWPM_SESSION0(ctypes.Structure):
    _fields_ = [("sessionKey", GUID), ("displayData", FWPM_DISPLAY_DATA0), ("flags", DWORD),
                ("txnWaitTimeoutInMSec", DWORD), ("processId", DWORD), ("sid", PVOID),
                ("username", LPWSTR), ("kernelMode", BOOL)]


class FWPM_PROVIDER0(ctypes.Structure):
    _fields_ = [("providerKey", GUID), ("displayData", FWPM_DISPLAY_DATA0), ("flags", DWORD),
                ("providerData", FWP_BYTE_BLOB), ("serviceName", LPWSTR)]


class FWPM_SUBLAYER0(ctypes.Structure):
    _fields_ = [("subLayerKey", GUID), ("displayData", FWPM_DISPLAY_DATA0), ("flags", WORD),
                ("providerKey", PVOID), ("providerData", FWP_BYTE_BLOB), ("weight", WORD)]


class FILETIME(ctypes.Structure):
    _fields_ = [("dwLowDateTime", DWORD), ("dwHighDateTime", DWORD)]


class SERVICE_STATUS(ctypes.Structure):
    _fields_ = [("dwServiceType", DWORD), ("dwCurrentState", DWORD),
                ("dwControlsAccepted", DWORD), ("dwWin32ExitCode", DWORD),
                ("dwServiceSpecificExitCode", DWORD), ("dwCheckPoint", DWORD),
                ("dwWaitHint", DWORD)]


class SERVICE_TABLE_ENTRYW(ctypes.Structure):
    _fields_ = [("lpServiceName", LPWSTR), ("lpServiceProc", PVOID)]
