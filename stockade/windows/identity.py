"""The per-launch AppContainer: its profile name, derived from the request id, and the profile
itself (CreateAppContainerProfile, deleted at settlement).

The name is `stockade-ac-` and 24 hex digits of a domain-separated SHA-256 of the request id: one
name per launch, in the shape the ledger retires when a record holding it is quarantined, so a
name seen in a quarantined record is never handed out again (`profile_name` refuses it). A
profile that already exists is never adopted: creation then fails (`appcontainer_exists`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import ntpath
import os
import re
from collections.abc import Callable

from stockade.errors import SetupError
from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.structs import PSID, PVOID

PROFILE_NAME = re.compile(r"stockade-ac-[0-9a-f]{24}")
_NOT_FOUND = (c.HRESULT_FILE_NOT_FOUND, c.HRESULT_PATH_NOT_FOUND, c.HRESULT_NOT_FOUND)
# Where Windows maps a package SID to its profile, under HKEY_CURRENT_USER.
MAPPINGS = ("Software\\Classes\\Local Settings\\Software\\Microsoft\\Windows\\CurrentVersion"
            "\\AppContainer\\Mappings")
_log = logging.getLogger(__name__)


def profile_name(request_id: str, retired: set[str]) -> str:
    digest = hashlib.sha256(b"stockade appcontainer\0" + request_id.encode()).hexdigest()
    name = f"stockade-ac-{digest[:24]}"
    if name in retired:
        raise SetupError("ledger_identity_reused",
                         "this launch's AppContainer name was seen in a quarantined record",
                         stage="identity")
    return name


def derive_sid(name: str) -> str:
    """The package SID Windows derives from a profile name (whether or not it exists)."""
    api = win32()
    psid = PSID()
    api.DeriveAppContainerSidFromAppContainerName(name, ctypes.byref(psid))
    try:
        return sid_string(psid)
    finally:
        api.FreeSid(psid)


def create_profile(name: str) -> str:
    """Create the profile, with no capabilities; its package SID."""
    api = win32()
    psid = PSID()
    result = api.CreateAppContainerProfile(name, "Stockade sandbox", "One Stockade launch",
                                           None, 0, ctypes.byref(psid)) & 0xFFFFFFFF
    if result == c.HRESULT_ALREADY_EXISTS:
        raise SetupError("appcontainer_exists",
                         "an AppContainer profile of this launch's name exists already",
                         stage="identity")
    if result:
        raise SetupError("appcontainer_failed",
                         f"CreateAppContainerProfile failed (HRESULT 0x{result:08X})",
                         stage="identity")
    try:
        return sid_string(psid)
    finally:
        api.FreeSid(psid)


def delete_profile(name: str, is_dir: Callable[[str], bool] | None = None,
                   mapped: Callable[[str], bool] | None = None) -> None:
    """Delete the profile, and fail (OSError) unless it is gone afterwards.

    DeleteAppContainerProfile returns success for a profile that does not exist, and may leave
    storage behind that a process still holds open, so its answer says nothing about whether a
    profile existed or is gone: `profile_exists` is asked instead."""
    result = win32().DeleteAppContainerProfile(name) & 0xFFFFFFFF
    if result:
        raise OSError(None, f"DeleteAppContainerProfile failed (HRESULT 0x{result:08X})")
    if profile_exists(name, is_dir, mapped):
        raise OSError(None, "the AppContainer profile's storage is still there after "
                            "DeleteAppContainerProfile")


def profile_exists(name: str, is_dir: Callable[[str], bool] | None = None,
                   mapped: Callable[[str], bool] | None = None) -> bool:
    """Whether the profile `name` (still) has its storage, asked without changing anything:
    its package SID is derived from the name, GetAppContainerFolderPath gives that
    AppContainer's local folder (`...\\Packages\\<name>\\AC`), and the profile exists while
    that folder's parent does. "Not found" instead of a path counts as no profile. What it
    answers for a deleted profile is not documented beyond that (E_INVALIDARG has been seen),
    so any other failure is asked of the registry (`mapped`: Windows' own mapping of the package
    SID to a profile, MAPPINGS): no mapping is no profile (the code logged); with a mapping it
    proves nothing either way, an OSError."""
    api = win32()
    path = PVOID()
    sid = derive_sid(name)
    result = api.GetAppContainerFolderPath(sid, ctypes.byref(path)) & 0xFFFFFFFF
    if result in _NOT_FOUND:
        return False
    if result:
        if not (mapped or mapping_exists)(sid):
            _log.info("GetAppContainerFolderPath: HRESULT 0x%08X for a profile Windows no "
                      "longer maps; counted as absent", result)
            return False
        raise OSError(None, f"GetAppContainerFolderPath failed (HRESULT 0x{result:08X})")
    try:
        folder = ctypes.wstring_at(path.value) if path.value else ""
    finally:
        api.CoTaskMemFree(path)
    return profile_folder_present(folder, name, is_dir or os.path.isdir)


def folder(sid: str) -> str:
    """The local folder of the AppContainer of package SID `sid` (`...\\Packages\\<name>\\AC`),
    which Windows makes for the profile and grants to that AppContainer; OSError if none."""
    api = win32()
    path = PVOID()
    result = api.GetAppContainerFolderPath(sid, ctypes.byref(path)) & 0xFFFFFFFF
    if result or not path.value:
        raise OSError(None, f"GetAppContainerFolderPath failed (HRESULT 0x{result:08X})")
    try:
        return ctypes.wstring_at(path.value)
    finally:
        api.CoTaskMemFree(path)


def mapping_exists(sid: str) -> bool:
    """Whether Windows maps package SID `sid` to a profile of this user (its Mappings key)."""
    import winreg  # (Windows only, like every caller)

    try:
        winreg.CloseKey(winreg.OpenKey(winreg.HKEY_CURRENT_USER, f"{MAPPINGS}\\{sid}"))
    except FileNotFoundError:
        return False
    return True


def profile_folder_present(folder: str, name: str, is_dir: Callable[[str], bool]) -> bool:
    """Whether `folder`, as GetAppContainerFolderPath gave it, is the profile's and there: its
    storage is the directory named after the profile, above `AC`."""
    storage = ntpath.dirname(folder.rstrip("\\"))
    return ntpath.basename(storage).casefold() == name.casefold() and is_dir(storage)


def sid_string(psid: ctypes.c_void_p | int) -> str:
    api = win32()
    text = ctypes.c_wchar_p()
    api.ConvertSidToStringSidW(psid, ctypes.byref(text))
    try:
        return text.value or ""
    finally:
        api.LocalFree(text)
