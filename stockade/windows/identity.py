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
import re

from stockade.errors import SetupError
from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.structs import PSID

PROFILE_NAME = re.compile(r"stockade-ac-[0-9a-f]{24}")


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


def delete_profile(name: str) -> bool:
    """Delete the profile; one that does not exist counts as deleted. Whether one existed."""
    result = win32().DeleteAppContainerProfile(name) & 0xFFFFFFFF
    if result not in (0, c.HRESULT_FILE_NOT_FOUND, c.HRESULT_NOT_FOUND):
        raise OSError(None, f"DeleteAppContainerProfile failed (HRESULT 0x{result:08X})")
    return result == 0


def sid_string(psid: ctypes.c_void_p | int) -> str:
    api = win32()
    text = ctypes.c_wchar_p()
    api.ConvertSidToStringSidW(psid, ctypes.byref(text))
    try:
        return text.value or ""
    finally:
        api.LocalFree(text)
