"""The fence service's named pipe, both ends, and what the kernel says of a process (Windows).

- The service's pipe (`server_pipe`): byte mode, remote clients rejected, at most
  `MAX_CONNECTIONS` instances, the first made with FILE_FLAG_FIRST_PIPE_INSTANCE (so a process
  that took the name first makes the service fail to start rather than share it), its security
  descriptor `PIPE_SDDL`: owned by SYSTEM; SYSTEM full control; Authenticated Users only
  reading and writing data, reading attributes and the descriptor (not FILE_APPEND_DATA, which
  on a pipe is FILE_CREATE_PIPE_INSTANCE: no one else may serve it); no entry for ALL
  APPLICATION PACKAGES, so no AppContainer can open it; a Medium no-write-up label, so nothing
  below Medium integrity can write to it.
- The client's end (`connect`): opened for exactly those rights, allowing the server to
  identify but not impersonate it (SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION), and
  refused unless the pipe's owner, read from the handle, is SYSTEM (`server_refusal`).
- `process_facts(pid)`: the process's token (user, AppContainer and package SID, integrity,
  restricted) and creation time, for fence.caller_refusal and fence.target_refusal.
"""

from __future__ import annotations

import ctypes
import os
import time

from stockade.errors import SetupError
from stockade.windows import constants as c
from stockade.windows import identity, tokens
from stockade.windows import sid as sids
from stockade.windows.api import win32
from stockade.windows.fence import TokenFacts
from stockade.windows.fenceapi import (
    ERROR_PIPE_BUSY,
    FILE_FLAG_FIRST_PIPE_INSTANCE,
    FILE_READ_DATA,
    FILE_WRITE_DATA,
    PIPE_ACCESS_DUPLEX,
    PIPE_REJECT_REMOTE_CLIENTS,
    PROCESS_QUERY_LIMITED_INFORMATION,
    SECURITY_IDENTIFICATION,
    SECURITY_SQOS_PRESENT,
    SYNCHRONIZE,
    TOKEN_INTEGRITY_LEVEL,
    fence_win32,
    filetime,
)
from stockade.windows.fenceproto import MAX_FRAME, PIPE
from stockade.windows.fwpstructs import FILETIME
from stockade.windows.structs import DWORD, HANDLE, PVOID, SECURITY_ATTRIBUTES, SID_AND_ATTRIBUTES

PIPE_SDDL = "O:SYD:P(A;;GA;;;SY)(A;;0x120083;;;AU)S:(ML;;NW;;;ME)"
CLIENT_ACCESS = FILE_READ_DATA | FILE_WRITE_DATA | c.READ_CONTROL | SYNCHRONIZE
MAX_CONNECTIONS = 64  # pipe instances: callers served at once
CONNECT_WAIT = 2.0  # seconds a client waits for a free instance
OWNER_SECURITY_INFORMATION = 0x00000001
SE_KERNEL_OBJECT = 6


class PipeTransport:
    """One end of the pipe as a descriptor (which owns the handle)."""

    def __init__(self, handle: int) -> None:
        import msvcrt  # (Windows only)

        self.handle = handle
        self._fd = msvcrt.open_osfhandle(handle, os.O_RDWR | os.O_BINARY | os.O_NOINHERIT)

    def read(self, size: int) -> bytes:
        try:
            return os.read(self._fd, size)
        except BrokenPipeError:
            return b""

    def write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def connect() -> PipeTransport:
    """The client's end, the server checked to be the service."""
    api, fence = win32(), fence_win32()
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        try:
            handle = api.CreateFileW(PIPE, CLIENT_ACCESS, 0, None, c.OPEN_EXISTING,
                                     SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION, None)
            break
        except OSError as exc:
            if exc.winerror != ERROR_PIPE_BUSY or time.monotonic() >= deadline:
                raise
            fence.WaitNamedPipeW(PIPE, int(CONNECT_WAIT * 1000))
    try:
        why = server_refusal(owner(handle))
        if why:
            raise SetupError("fence_server_untrusted", f"{why}: another process took the "
                             "service's pipe name", stage="network")
        return PipeTransport(handle)
    except BaseException:
        api.CloseHandle(handle)
        raise


def server_refusal(owner_sid: str) -> str | None:
    """Why a pipe owned by `owner_sid` is not the fence service's (which makes it SYSTEM's:
    PIPE_SDDL), or None."""
    if owner_sid.upper() != sids.SYSTEM:
        return "the fence pipe is not LocalSystem's"
    return None


def owner(handle: int) -> str:
    """The owner SID of the kernel object `handle` (opened with READ_CONTROL)."""
    api = win32()
    sid, descriptor = PVOID(), PVOID()
    api.GetSecurityInfo(handle, SE_KERNEL_OBJECT, OWNER_SECURITY_INFORMATION,
                        ctypes.byref(sid), None, None, None, ctypes.byref(descriptor))
    try:
        return identity.sid_string(sid)
    finally:
        api.LocalFree(descriptor)


def server_pipe(first: bool) -> int:
    """A new instance of the service's pipe, waiting for a client."""
    api = win32()
    descriptor = PVOID()
    api.ConvertStringSecurityDescriptorToSecurityDescriptorW(
        PIPE_SDDL, c.SDDL_REVISION_1, ctypes.byref(descriptor), None)
    try:
        attributes = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), descriptor, False)
        return fence_win32().CreateNamedPipeW(
            PIPE, PIPE_ACCESS_DUPLEX | (FILE_FLAG_FIRST_PIPE_INSTANCE if first else 0),
            PIPE_REJECT_REMOTE_CLIENTS, MAX_CONNECTIONS, 2 * MAX_FRAME, 2 * MAX_FRAME, 0,
            ctypes.byref(attributes))
    finally:
        api.LocalFree(descriptor)


def client_pid(pipe: int) -> int:
    pid = DWORD()
    fence_win32().GetNamedPipeClientProcessId(pipe, ctypes.byref(pid))
    return pid.value


def process_facts(pid: int) -> TokenFacts:
    """What the kernel says of process `pid` (OSError if it cannot be opened)."""
    api, fence = win32(), fence_win32()
    process = fence.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    try:
        times = [FILETIME() for _ in range(4)]
        fence.GetProcessTimes(process, *(ctypes.byref(t) for t in times))
        token = HANDLE()
        api.OpenProcessToken(process, c.TOKEN_QUERY, ctypes.byref(token))
    finally:
        api.CloseHandle(process)
    try:
        user = _sid_and_attributes(token, c.TOKEN_USER)
        label = _sid_and_attributes(token, TOKEN_INTEGRITY_LEVEL)
        is_appcontainer = DWORD.from_buffer(
            tokens.information(token, c.TOKEN_IS_APP_CONTAINER)).value
        buffer = tokens.information(token, c.TOKEN_APP_CONTAINER_SID)
        package = tokens.package_sid(buffer.raw, ctypes.addressof(buffer))
        restricted = bool(fence.IsTokenRestricted(token))
    finally:
        api.CloseHandle(token)
    return TokenFacts(user=user, appcontainer=bool(is_appcontainer), package=package,
                      integrity=int(label.rpartition("-")[2]), restricted=restricted,
                      created=filetime(times[0]))


def _sid_and_attributes(token: HANDLE, info_class: int) -> str:
    """The SID of a TOKEN_USER or TOKEN_MANDATORY_LABEL answer (a SID_AND_ATTRIBUTES)."""
    buffer = tokens.information(token, info_class)
    return tokens.sid_in(buffer.raw, ctypes.addressof(buffer),
                         SID_AND_ATTRIBUTES.from_buffer_copy(buffer.raw).Sid)
