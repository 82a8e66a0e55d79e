"""The Windows readiness probe's child: run inside the probe sandbox as `python -I -S -c SOURCE
PARAMS`, it reports, as one JSON object on stdout, what it finds from inside: its token, its Job
(membership, and the Job's settings as QueryInformationJobObject gives them to the process
itself), its mitigation policies, the desktop its thread is on and whether it can open the
user's default desktop, its environment's names, and what its file (its workspace, its TEMP, a
protected, a denied and an outside path) and loopback attempts did.

Standard library and ctypes only, and nothing of Stockade's (it is not readable in there).
Structures are sent back as raw bytes (hex, with the buffer's address where a pointer may point
into it), so the probe decodes them with the very layouts the backend uses (structs.py) rather
than with a second copy. Every value is something observed; nothing comes from the plan.
"""

import ctypes
import errno
import json
import os
import socket
import sys

TOKEN_QUERY, DESKTOP_READOBJECTS, UOI_NAME = 0x8, 0x1, 2
# Token information classes; Job information classes; mitigation policies (as in constants.py).
TOKEN_CLASSES = {"is_appcontainer": 29, "capabilities": 30, "package": 31}
JOB_CLASSES = {"extended": 9, "ui": 4, "cpu_rate": 15}
MITIGATION_POLICIES = {"extension_points": 6, "image_load": 10}

HANDLE, DWORD, P = ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER
SIGNATURES = {  # name: (dll, restype, argtypes)
    "GetCurrentProcess": ("kernel32", HANDLE, []),
    "GetCurrentThreadId": ("kernel32", DWORD, []),
    "IsProcessInJob": ("kernel32", ctypes.c_int32, [HANDLE, HANDLE, P(ctypes.c_int32)]),
    "QueryInformationJobObject": ("kernel32", ctypes.c_int32,
                                  [HANDLE, ctypes.c_int, ctypes.c_void_p, DWORD, P(DWORD)]),
    "GetProcessMitigationPolicy": ("kernel32", ctypes.c_int32,
                                   [HANDLE, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]),
    "OpenProcessToken": ("advapi32", ctypes.c_int32, [HANDLE, DWORD, P(HANDLE)]),
    "GetTokenInformation": ("advapi32", ctypes.c_int32,
                            [HANDLE, ctypes.c_int, ctypes.c_void_p, DWORD, P(DWORD)]),
    "GetThreadDesktop": ("user32", HANDLE, [DWORD]),
    "GetUserObjectInformationW": ("user32", ctypes.c_int32,
                                  [HANDLE, ctypes.c_int, ctypes.c_void_p, DWORD, P(DWORD)]),
    "OpenDesktopW": ("user32", HANDLE, [ctypes.c_wchar_p, DWORD, ctypes.c_int32, DWORD]),
    "CloseDesktop": ("user32", ctypes.c_int32, [HANDLE]),
}


class Win32:
    """The functions above, bound on creation (only ever inside the probe sandbox)."""

    def __init__(self):
        dlls = {}
        for name, (dll, restype, argtypes) in SIGNATURES.items():
            if dll not in dlls:
                dlls[dll] = ctypes.WinDLL(dll, use_last_error=True)
            function = getattr(dlls[dll], name)
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name, function)


def answer(call, size):
    """What `call(buffer, size)` wrote, as hex with the buffer's address; or its error."""
    buffer = ctypes.create_string_buffer(size)
    if not call(buffer, size):
        return {"error": ctypes.get_last_error()}
    return {"hex": buffer.raw.hex(), "address": ctypes.addressof(buffer)}


def token(api):
    handle = HANDLE()
    if not api.OpenProcessToken(api.GetCurrentProcess(), TOKEN_QUERY, ctypes.byref(handle)):
        return {"error": ctypes.get_last_error()}
    return {name: answer(lambda b, n, k=k: api.GetTokenInformation(handle, k, b, n,
                                                                    ctypes.byref(DWORD())),
                         1024) for name, k in TOKEN_CLASSES.items()}


def job(api, sizes):
    inside = ctypes.c_int32()
    api.IsProcessInJob(api.GetCurrentProcess(), None, ctypes.byref(inside))
    seen = {name: answer(lambda b, n, k=k: api.QueryInformationJobObject(None, k, b, n, None),
                         sizes[name]) for name, k in JOB_CLASSES.items()}
    return {"in_job": bool(inside.value), **seen}


def mitigations(api):
    return {name: answer(lambda b, n, k=k: api.GetProcessMitigationPolicy(
        api.GetCurrentProcess(), k, b, n), 4) for name, k in MITIGATION_POLICIES.items()}


def desktop(api):
    name = ctypes.create_unicode_buffer(256)
    api.GetUserObjectInformationW(api.GetThreadDesktop(api.GetCurrentThreadId()), UOI_NAME,
                                  name, ctypes.sizeof(name), ctypes.byref(DWORD()))
    other = api.OpenDesktopW("Default", 0, False, DESKTOP_READOBJECTS)
    if other:
        api.CloseDesktop(other)
    return {"name": name.value, "default_desktop": "ok" if other else "denied"}


def outcome(attempt):
    try:
        attempt()
        return "ok"
    except PermissionError:
        return "denied"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, f"winerror {exc.winerror}")


def write(path):
    with open(path, "a") as f:
        f.write("x")


def read(path):
    with open(path, "rb") as f:
        f.read(1)


def temp():
    """Whether a file can be made in TEMP (the launch's own temp folder), without ever writing
    elsewhere when TEMP is unset."""
    folder = os.environ.get("TEMP")
    if not folder:
        return "unset"
    return outcome(lambda: write(os.path.join(folder, "probe-temp")))


def main():
    params = json.loads(sys.argv[1])
    api = Win32()
    report = {"token": token(api), "job": job(api, params["sizes"]),
              "mitigations": mitigations(api), "desktop": desktop(api),
              "environment": sorted(os.environ), "temp": temp(),
              "files": {"write_root": outcome(lambda: write("probe-write")),
                        "protected_name": outcome(lambda: write(params["protected"])),
                        "denied_path": outcome(lambda: os.listdir(params["denied"])),
                        "outside_path": outcome(lambda: read(params["outside"]))},
              "tcp_loopback": outcome(lambda: socket.create_connection(
                  ("127.0.0.1", params["tcp_port"]), timeout=5).close())}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
