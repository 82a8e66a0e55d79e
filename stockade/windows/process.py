"""CreateProcessW with an extended startup info whose attribute list carries, for the new process:

- SECURITY_CAPABILITIES: its AppContainer (package SID; no capabilities but those of the
  standing grants on its runtime roots, standing.py);
- JOB_LIST: the launch's Job, so the process is in it from its first instruction (never created
  first and assigned later);
- HANDLE_LIST: exactly the three standard handles, the only ones it inherits;
- MITIGATION_POLICY: legacy extension points (AppInit DLLs and the like) off, no images from
  remote shares, and, unless `exec_from_write`, no images carrying a Low integrity label (what a
  sandboxed process writes carries one).

It is created suspended and detached from any console (so it cannot write into the owner's
console input), on the private desktop, with the closed environment block, in the sandbox's
working directory. The caller verifies the new token and Job membership (tokens.py) and resumes
it, or kills the Job.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.api import win32
from stockade.windows.structs import (
    DWORD64,
    HANDLE,
    PROCESS_BASIC_INFORMATION,
    PROCESS_INFORMATION,
    PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY,
    PROCESS_MITIGATION_IMAGE_LOAD_POLICY,
    SECURITY_ATTRIBUTES,
    SECURITY_CAPABILITIES,
    SID_AND_ATTRIBUTES,
    SIZE_T,
    STARTUPINFOEXW,
)

CREATION_FLAGS = (c.EXTENDED_STARTUPINFO_PRESENT | c.CREATE_UNICODE_ENVIRONMENT
                  | c.CREATE_SUSPENDED | c.DETACHED_PROCESS)


def mitigation_bits(extension_points: int, image_load: int) -> int:
    """The MITIGATION_POLICY bits (as `mitigations` gives them) that a process's policies,
    as GetProcessMitigationPolicy reports them, hold."""
    bits = c.MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON \
        if extension_points & c.EXTENSION_POINTS_DISABLED else 0
    if image_load & c.IMAGE_NO_REMOTE:
        bits |= c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON
    if image_load & c.IMAGE_NO_LOW_LABEL:
        bits |= c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON
    return bits


def handles_refusal(held: tuple[bool, ...]) -> str | None:
    """Why the child's inherited handles are not exactly its three standard ones: `held` says,
    for its stdin, stdout and stderr and then for an inheritable canary outside the handle
    list, whether the child holds that very object."""
    if not all(held[:3]):
        return "the child does not hold its three standard handles"
    if any(held[3:]):
        return "the child inherited a handle outside its handle list"
    return None


def mitigations(exec_from_write: bool) -> int:
    policy = (c.MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON
              | c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON)
    if not exec_from_write:
        policy |= c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON
    return policy


@dataclass(frozen=True)
class Launch:
    application: str
    command_line: str
    environment: str
    cwd: str
    desktop: str
    package_sid: str
    job: int
    stdio: tuple[int, int, int]  # inheritable handles: stdin, stdout, stderr
    mitigations: int
    capabilities: tuple[str, ...] = ()  # standing grants' capability SIDs (standing.py)


@dataclass(frozen=True)
class Created:
    process: int
    thread: int
    pid: int
    thread_id: int


def create(launch: Launch) -> Created:
    api = win32()
    sid = ctypes.create_string_buffer(sids.to_bytes(launch.package_sid))
    held = [ctypes.create_string_buffer(sids.to_bytes(cap)) for cap in launch.capabilities]
    granted = (SID_AND_ATTRIBUTES * max(1, len(held)))(
        *(SID_AND_ATTRIBUTES(ctypes.addressof(b), c.SE_GROUP_ENABLED) for b in held))
    capabilities = SECURITY_CAPABILITIES(
        AppContainerSid=ctypes.addressof(sid), CapabilityCount=len(held),
        Capabilities=ctypes.cast(granted, ctypes.POINTER(SID_AND_ATTRIBUTES)) if held else None)
    jobs = (HANDLE * 1)(launch.job)
    handles = (HANDLE * 3)(*launch.stdio)
    policy = DWORD64(launch.mitigations)
    attributes = [(c.PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES, capabilities),
                  (c.PROC_THREAD_ATTRIBUTE_JOB_LIST, jobs),
                  (c.PROC_THREAD_ATTRIBUTE_HANDLE_LIST, handles),
                  (c.PROC_THREAD_ATTRIBUTE_MITIGATION_POLICY, policy)]
    size = SIZE_T()
    api.InitializeProcThreadAttributeList(None, len(attributes), 0, ctypes.byref(size))
    attribute_list = ctypes.create_string_buffer(size.value)
    if not api.InitializeProcThreadAttributeList(attribute_list, len(attributes), 0,
                                                 ctypes.byref(size)):
        raise ctypes.WinError(ctypes.get_last_error())
    try:
        for attribute, value in attributes:
            api.UpdateProcThreadAttribute(attribute_list, 0, attribute, ctypes.byref(value),
                                          ctypes.sizeof(value), None, None)
        startup = STARTUPINFOEXW()
        startup.StartupInfo.cb = ctypes.sizeof(STARTUPINFOEXW)
        startup.StartupInfo.lpDesktop = launch.desktop
        startup.StartupInfo.dwFlags = c.STARTF_USESTDHANDLES
        stdin, stdout, stderr = launch.stdio
        startup.StartupInfo.hStdInput = stdin
        startup.StartupInfo.hStdOutput = stdout
        startup.StartupInfo.hStdError = stderr
        startup.lpAttributeList = ctypes.addressof(attribute_list)
        info = PROCESS_INFORMATION()
        command_line = ctypes.create_unicode_buffer(launch.command_line)  # CreateProcessW
        environment = ctypes.create_unicode_buffer(launch.environment)    # may write to both
        api.CreateProcessW(launch.application, command_line, None, None, True, CREATION_FLAGS,
                           environment, launch.cwd, ctypes.byref(startup), ctypes.byref(info))
        return Created(info.hProcess, info.hThread, info.dwProcessId, info.dwThreadId)
    finally:
        api.DeleteProcThreadAttributeList(attribute_list)


# What the host does with a child the broker created (handle.py): read its token, Job and
# mitigations, duplicate handles out of it, wait for it; and resume its thread.
CHILD_RIGHTS = c.PROCESS_QUERY_INFORMATION | c.PROCESS_DUP_HANDLE | c.SYNCHRONIZE


def opened(pid: int, thread_id: int) -> Created:
    """The suspended child the broker created, opened by its ids (it cannot end before it is
    resumed, so they name it still; the host's verification checks it is in the Job)."""
    api = win32()
    process = api.OpenProcess(CHILD_RIGHTS, False, pid)
    try:
        thread = api.OpenThread(c.THREAD_SUSPEND_RESUME, False, thread_id)
    except BaseException:
        api.CloseHandle(process)
        raise
    return Created(process, thread, pid, thread_id)


def creator(process: int) -> int:
    """The id of the process that created `process` (NtQueryInformationProcess's
    InheritedFromUniqueProcessId: CreateProcessW's caller, unless a parent was named for it with
    PROC_THREAD_ATTRIBUTE_PARENT_PROCESS, which the launcher never does)."""
    info = PROCESS_BASIC_INFORMATION()
    win32().NtQueryInformationProcess(process, c.PROCESS_BASIC_INFORMATION_CLASS,
                                      ctypes.byref(info), ctypes.sizeof(info), None)
    return info.InheritedFromUniqueProcessId


def observed_mitigations(process: int) -> int:
    """The mitigation bits the (suspended) process was created with, as it reports them."""
    api = win32()
    extension = PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY()
    image = PROCESS_MITIGATION_IMAGE_LOAD_POLICY()
    for policy, info in ((c.PROCESS_EXTENSION_POINT_DISABLE_POLICY, extension),
                         (c.PROCESS_IMAGE_LOAD_POLICY, image)):
        api.GetProcessMitigationPolicy(process, policy, ctypes.byref(info), ctypes.sizeof(info))
    return mitigation_bits(extension.Flags, image.Flags)


def inheritable_canary() -> int:
    """An inheritable event, alive while the child is created, outside its handle list: if the
    list were not in force the child would inherit it."""
    attributes = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), None, 1)
    return win32().CreateEventW(ctypes.byref(attributes), True, False, None)


def holds(process: int, handles: tuple[int, ...]) -> tuple[bool, ...]:
    """For each of this process's `handles`, whether `process` holds the same object under the
    same value (as an inherited handle is): duplicated out of it and compared."""
    api = win32()
    held = []
    for value in handles:
        copy = HANDLE()
        try:
            api.DuplicateHandle(process, value, api.GetCurrentProcess(), ctypes.byref(copy), 0,
                                False, c.DUPLICATE_SAME_ACCESS)
        except OSError as exc:
            if exc.winerror != c.ERROR_INVALID_HANDLE:
                raise
            held.append(False)
            continue
        try:
            held.append(bool(api.CompareObjectHandles(copy, value)))
        finally:
            api.CloseHandle(copy)
    return tuple(held)
