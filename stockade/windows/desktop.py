"""A private desktop per launch, so the sandbox's windows (and hooks, and window messages) never
share a desktop with the user's, and the launch's AppContainer allowed onto this process's
window station, which it must connect to before its first instruction.

The desktop's security descriptor (`desktop_sddl`, pure): a protected DACL granting full
control to SYSTEM and the launching user, and to the launch's AppContainer only what a process
needs to attach to a desktop and create windows on it — read and write desktop objects, create
windows and menus, read the descriptor — never hooks, journaling, enumeration or switching the
input desktop; and a Low mandatory label (no write up), since AppContainer processes run at Low
integrity. The name is random per launch, so no other process can create it first with a
weaker descriptor. It is made with CreateDesktopExW and a heap of DESKTOP_HEAP_KB: desktop
heaps come from one session-wide pool, and many concurrent launches with the default heap of
an interactive desktop would exhaust it.

The window station: its DACL grants nothing to a fresh AppContainer (in a service's
non-interactive session not even to every AppContainer), and a process that cannot connect to
its window station dies initialising (STATUS_DLL_INIT_FAILED). So the launch adds one entry for
its package SID, with only STATION_RIGHTS, recorded in the ledger (kind `winsta`) before it is
added and removed at settlement or by reconciliation (`station_granted`/`station_revoked`,
pure). A private window station is not an option here: only administrators may name one, and
an unnamed one is the logon session's, shared and possibly the very station this process is in.

A process started under other credentials (runas, Start-Process -Credential:
CreateProcessWithLogonW) runs on the window station and desktop named by its STARTUPINFO's
lpDesktop or, that being NULL or empty, on its starter's. Microsoft's page for
CreateProcessWithLogonW says the application must add permission for the user to either, "even
for WinSta0\\Default"; only on Windows XP did the function add it to the inherited ones itself
(CreateProcessWithTokenW's page says that function does, with lpDesktop NULL). Whatever entry
is added lets the user's processes connect; none is documented to let it change the station's
DACL or create a desktop there, which a launch needs. So where the station grants this user
that not, the launch is refused, typed (`window_station_denied`, `check_station` before
anything is recorded, `create_desktop`), never a bare Win32 error. This process's own child is
always given its desktop by name (`station\\desktop`, process.py), never NULL.
"""

from __future__ import annotations

import ctypes
import re
import secrets
from collections.abc import Callable

from stockade.errors import SetupError
from stockade.windows import acl
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace
from stockade.windows.aclstore import aces_at
from stockade.windows.api import fresh_last_error, last_error, station_denied, win32
from stockade.windows.structs import DWORD, PVOID, SECURITY_ATTRIBUTES

APPCONTAINER_RIGHTS = (c.DESKTOP_READOBJECTS | c.DESKTOP_CREATEWINDOW | c.DESKTOP_CREATEMENU
                       | c.DESKTOP_WRITEOBJECTS | c.READ_CONTROL)
# What a process needs of its window station to start: its attributes and the atom table that
# window classes live in (the Job's UI restrictions keep it from the global atoms and the
# clipboard); never enumerating desktops, creating one, reading the screen or logging off.
STATION_RIGHTS = c.WINSTA_READATTRIBUTES | c.WINSTA_ACCESSGLOBALATOMS
STATION_KIND = "winsta"  # the ledger kind of a window-station entry
DESKTOP_HEAP_KB = 1024  # per launch: enough for console programs and a few windows


def desktop_name() -> str:
    return f"stockade-{secrets.token_hex(12)}"


# `station\desktop` where the desktop is one desktop_name makes.
_LAUNCH_DESKTOP = re.compile(r"[^\\\0]{1,256}\\stockade-[0-9a-f]{24}")


def is_launch_desktop(name: str) -> bool:
    """Whether `name` (`station\\desktop`) names a launch's private desktop, never another."""
    return bool(_LAUNCH_DESKTOP.fullmatch(name))


def desktop_sddl(user_sid: str, appcontainer_sid: str) -> str:
    for sid in (user_sid, appcontainer_sid):
        sids.to_bytes(sid)  # ValueError unless a SID: nothing else may reach the SDDL
    if not sids.is_appcontainer(appcontainer_sid):
        raise ValueError("the desktop's sandbox trustee must be a package SID")
    return (f"D:P(A;;GA;;;{sids.SYSTEM})(A;;GA;;;{user_sid})"
            f"(A;;0x{APPCONTAINER_RIGHTS:X};;;{appcontainer_sid})S:(ML;;NW;;;LW)")


def station_granted(aces: tuple[Ace, ...], sid: str) -> tuple[Ace, ...]:
    """The window station's entries with the launch's one added (not inherited by desktops)."""
    if not sids.is_appcontainer(sid):
        raise ValueError("only a package SID is granted the window station")
    return (*station_revoked(aces, sid), Ace.allow(sid, STATION_RIGHTS))


def station_revoked(aces: tuple[Ace, ...], sid: str) -> tuple[Ace, ...]:
    """The entries without any of `sid`'s, every other one as it was, in order."""
    return tuple(a for a in aces if a.sid.upper() != sid.upper())


def create_desktop(name: str, sddl: str) -> int:
    """Create the desktop, with a bounded heap, in this process's window station; its handle
    (refusing a desktop of that name that existed already)."""
    api = win32()
    descriptor = PVOID()
    api.ConvertStringSecurityDescriptorToSecurityDescriptorW(
        sddl, c.SDDL_REVISION_1, ctypes.byref(descriptor), None)
    try:
        attributes = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), descriptor, 0)
        fresh_last_error()
        try:
            handle = api.CreateDesktopExW(name, None, None, 0, c.GENERIC_ALL,
                                          ctypes.byref(attributes), DESKTOP_HEAP_KB, None)
        except OSError as exc:
            if exc.winerror == c.ERROR_ACCESS_DENIED:
                raise station_denied("create a desktop on its window station") from None
            raise
        if last_error() == c.ERROR_ALREADY_EXISTS:
            api.CloseDesktop(handle)
            raise SetupError("desktop_exists", "a desktop of this launch's name exists already",
                             stage="desktop")
        return handle
    finally:
        api.LocalFree(descriptor)


def check_station(name: str) -> None:
    """Refuse, typed, a window station whose DACL this process may not change (before
    anything is recorded for it: the record's removal would meet the same refusal)."""
    api = win32()
    try:
        station = api.OpenWindowStationW(name, False, c.READ_CONTROL | c.WRITE_DAC)
    except OSError as exc:
        if exc.winerror == c.ERROR_ACCESS_DENIED:
            raise station_denied("change the access control of its window station") from None
        raise
    api.CloseWindowStation(station)


def object_name(handle: int) -> str:
    """A window station's or desktop's name (UOI_NAME)."""
    size = DWORD()
    buffer = ctypes.create_unicode_buffer(256)
    win32().GetUserObjectInformationW(handle, c.UOI_NAME, buffer, ctypes.sizeof(buffer),
                                      ctypes.byref(size))
    return buffer.value


def window_station() -> str:
    """The name of this process's window station (where `create_desktop` creates)."""
    return object_name(win32().GetProcessWindowStation())


def object_aces(handle: int) -> tuple[Ace, ...]:
    """The DACL of a window station or desktop, as read back (GetSecurityInfo)."""
    api = win32()
    dacl, descriptor = PVOID(), PVOID()
    api.GetSecurityInfo(handle, c.SE_WINDOW_OBJECT, c.DACL_SECURITY_INFORMATION, None, None,
                        ctypes.byref(dacl), None, ctypes.byref(descriptor))
    try:
        if not dacl.value:
            raise OSError(None, "the object has no DACL; Stockade will not change it")
        return aces_at(dacl.value)
    finally:
        api.LocalFree(descriptor)


def change_station(name: str, change: Callable[[tuple[Ace, ...]], tuple[Ace, ...]]
                   ) -> tuple[Ace, ...]:
    """Rewrite the DACL of the window station `name` (of this session) as `change` says; its
    entries as read back afterwards. One that does not exist (another session's, gone since)
    has nothing to change, and no entries."""
    api = win32()
    try:
        station = api.OpenWindowStationW(name, False, c.READ_CONTROL | c.WRITE_DAC)
    except OSError as exc:
        if exc.winerror == c.ERROR_FILE_NOT_FOUND:
            return ()
        raise
    try:
        aces = object_aces(station)
        wanted = change(aces)
        if wanted == aces:
            return aces
        data = ctypes.create_string_buffer(acl.encode(wanted))
        api.SetSecurityInfo(station, c.SE_WINDOW_OBJECT, c.DACL_SECURITY_INFORMATION,
                            None, None, data, None)
        return object_aces(station)
    finally:
        api.CloseWindowStation(station)
