"""A private desktop per launch, so the sandbox's windows (and hooks, and window messages) never
share a desktop with the user's.

Its security descriptor (`desktop_sddl`, pure): a protected DACL granting full control to SYSTEM
and the launching user, and to the launch's AppContainer only what a process needs to attach to a
desktop and create windows on it — read and write desktop objects, create windows and menus,
read the descriptor — never hooks, journaling, enumeration or switching the input desktop; and a
Low mandatory label (no write up), since AppContainer processes run at Low integrity. The name is
random per launch, so no other process can create it first with a weaker descriptor.
"""

from __future__ import annotations

import ctypes
import secrets

from stockade.errors import SetupError
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.api import fresh_last_error, last_error, win32
from stockade.windows.structs import DWORD, PVOID, SECURITY_ATTRIBUTES

APPCONTAINER_RIGHTS = (c.DESKTOP_READOBJECTS | c.DESKTOP_CREATEWINDOW | c.DESKTOP_CREATEMENU
                       | c.DESKTOP_WRITEOBJECTS | c.READ_CONTROL)


def desktop_name() -> str:
    return f"stockade-{secrets.token_hex(12)}"


def desktop_sddl(user_sid: str, appcontainer_sid: str) -> str:
    for sid in (user_sid, appcontainer_sid):
        sids.to_bytes(sid)  # ValueError unless a SID: nothing else may reach the SDDL
    if not sids.is_appcontainer(appcontainer_sid):
        raise ValueError("the desktop's sandbox trustee must be a package SID")
    return (f"D:P(A;;GA;;;{sids.SYSTEM})(A;;GA;;;{user_sid})"
            f"(A;;0x{APPCONTAINER_RIGHTS:X};;;{appcontainer_sid})S:(ML;;NW;;;LW)")


def create_desktop(name: str, sddl: str) -> int:
    """Create the desktop in this process's window station; its handle (refusing a desktop of
    that name that existed already)."""
    api = win32()
    descriptor = PVOID()
    api.ConvertStringSecurityDescriptorToSecurityDescriptorW(
        sddl, c.SDDL_REVISION_1, ctypes.byref(descriptor), None)
    try:
        attributes = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), descriptor, 0)
        fresh_last_error()
        handle = api.CreateDesktopW(name, None, None, 0, c.GENERIC_ALL,
                                    ctypes.byref(attributes))
        if last_error() == c.ERROR_ALREADY_EXISTS:
            api.CloseDesktop(handle)
            raise SetupError("desktop_exists", "a desktop of this launch's name exists already",
                             stage="desktop")
        return handle
    finally:
        api.LocalFree(descriptor)


def window_station() -> str:
    """The name of this process's window station (where `create_desktop` creates)."""
    api = win32()
    size = DWORD()
    buffer = ctypes.create_unicode_buffer(256)
    api.GetUserObjectInformationW(api.GetProcessWindowStation(), c.UOI_NAME, buffer,
                                  ctypes.sizeof(buffer), ctypes.byref(size))
    return buffer.value
