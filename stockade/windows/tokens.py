"""Process tokens: the launching user's SID, whether it is elevated, and the check that a freshly
created (still suspended) child runs under the expected AppContainer, with no capabilities but
its runtime roots' (standing.py), in the expected Job. `token_refusal`, `ChildToken.facts` and
`capability_sids` are pure; the rest reads tokens."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.api import win32
from stockade.windows.structs import (
    BOOL,
    DWORD,
    HANDLE,
    SID_AND_ATTRIBUTES,
    TOKEN_APPCONTAINER_INFORMATION,
)


@dataclass(frozen=True)
class ChildToken:
    """What a child's token and Job membership were observed to be."""

    in_job: bool
    is_appcontainer: bool
    package_sid: str
    capabilities: tuple[str, ...]

    def refusal(self, expected_sid: str, expected_capabilities: tuple[str, ...] = ()
                ) -> str | None:
        return token_refusal(self.in_job, self.is_appcontainer, self.package_sid,
                             self.capabilities, expected_sid, expected_capabilities)

    def facts(self, expected_sid: str, expected_capabilities: tuple[str, ...] = ()
              ) -> dict[str, object]:
        """The observations as facts that name no SID (for `Handle.enforced`):
        `capabilities` counts those beyond the launch's standing grants' (standing.py)."""
        return {"in_job": self.in_job, "appcontainer_token": self.is_appcontainer,
                "launch_package_sid": self.package_sid.upper() == expected_sid.upper(),
                "capabilities": len(unexpected(self.capabilities, expected_capabilities))}


def unexpected(held: tuple[str, ...], expected: tuple[str, ...]) -> list[str]:
    """Capabilities `held` beyond `expected`, and any of `expected` missing."""
    want = {sid.upper() for sid in expected}
    have = [sid.upper() for sid in held]
    return [sid for sid in have if sid not in want] + sorted(want - set(have))


def token_refusal(in_job: bool, is_appcontainer: bool, package_sid: str,
                  capabilities: tuple[str, ...], expected_sid: str,
                  expected_capabilities: tuple[str, ...] = ()) -> str | None:
    if not in_job:
        return "the child is not in the launch's Job"
    if not is_appcontainer:
        return "the child's token is not an AppContainer token"
    if package_sid.upper() != expected_sid.upper():
        return "the child's AppContainer is not the launch's"
    if unexpected(capabilities, expected_capabilities):
        return (f"the child's token holds {len(capabilities)} capabilities, expected exactly "
                f"the {len(expected_capabilities)} of its runtime roots' standing grants")
    return None


def capability_sids(raw: bytes, address: int) -> tuple[str, ...]:
    """The SIDs of a TokenCapabilities answer (TOKEN_GROUPS: a count, then SID_AND_ATTRIBUTES
    at the pointer's alignment), each read from the buffer itself (sid_in)."""
    count = int.from_bytes(raw[:4], "little")
    first = ctypes.alignment(SID_AND_ATTRIBUTES)
    size = ctypes.sizeof(SID_AND_ATTRIBUTES)
    return tuple(sid_in(raw, address, SID_AND_ATTRIBUTES.from_buffer_copy(
        raw, max(first, 4) + i * size).Sid) for i in range(count))


def sid_in(raw: bytes, address: int, pointer: int | None) -> str:
    """The SID that `pointer` designates inside a GetTokenInformation answer: `raw` is the
    whole buffer, `address` where it lay. GetTokenInformation puts the SID in the same buffer,
    after the structure pointing to it, so it is read from those bytes, never through the
    pointer (which dangles once the buffer is freed). "" for a null pointer."""
    if not pointer:
        return ""
    offset = pointer - address
    if not 0 < offset < len(raw):
        raise ValueError("the SID lies outside the token information buffer")
    return sids.from_bytes(raw[offset:])[0]


def package_sid(raw: bytes, address: int) -> str:
    """The package SID of a TokenAppContainerSid answer ("" when the token has none)."""
    pointer = TOKEN_APPCONTAINER_INFORMATION.from_buffer_copy(raw).TokenAppContainer
    return sid_in(raw, address, pointer)


def current_user_sid() -> str:
    api = win32()
    token = HANDLE()
    api.OpenProcessToken(api.GetCurrentProcess(), c.TOKEN_QUERY, ctypes.byref(token))
    try:
        buffer = information(token, c.TOKEN_USER)
        return sid_in(buffer.raw, ctypes.addressof(buffer),
                      SID_AND_ATTRIBUTES.from_buffer_copy(buffer.raw).Sid)
    finally:
        api.CloseHandle(token)


def elevated() -> bool:
    """Whether this process runs elevated (as an administrator, past UAC)."""
    return bool(_own_dword(c.TOKEN_ELEVATION))


def session_id() -> int:
    """This process's session (0: the services'; each logon, local or remote, has its own)."""
    return _own_dword(c.TOKEN_SESSION_ID)


def _own_dword(info_class: int) -> int:
    api = win32()
    token = HANDLE()
    api.OpenProcessToken(api.GetCurrentProcess(), c.TOKEN_QUERY, ctypes.byref(token))
    try:
        return DWORD.from_buffer(information(token, info_class)).value
    finally:
        api.CloseHandle(token)


def child_token(process: int, job: int) -> ChildToken:
    """What the child `process`'s token says, and whether it is in `job`."""
    api = win32()
    in_job = BOOL()
    api.IsProcessInJob(process, job, ctypes.byref(in_job))
    token = HANDLE()
    api.OpenProcessToken(process, c.TOKEN_QUERY, ctypes.byref(token))
    try:
        is_appcontainer = DWORD.from_buffer(information(token, c.TOKEN_IS_APP_CONTAINER)).value
        buffer = information(token, c.TOKEN_APP_CONTAINER_SID)  # holds the SID: kept alive
        package = package_sid(buffer.raw, ctypes.addressof(buffer))
        groups = information(token, c.TOKEN_CAPABILITIES)  # holds the SIDs: kept alive
        capabilities = capability_sids(groups.raw, ctypes.addressof(groups))
        return ChildToken(bool(in_job.value), bool(is_appcontainer), package, capabilities)
    finally:
        api.CloseHandle(token)


def information(token: HANDLE, info_class: int) -> ctypes.Array:
    """GetTokenInformation's answer, in a buffer of the size it asks for."""
    api = win32()
    size = DWORD()
    try:
        api.GetTokenInformation(token, info_class, None, 0, ctypes.byref(size))
    except OSError as exc:
        if exc.winerror not in (c.ERROR_INSUFFICIENT_BUFFER, c.ERROR_BAD_LENGTH):
            raise
    buffer = ctypes.create_string_buffer(max(size.value, ctypes.sizeof(ctypes.c_void_p)))
    api.GetTokenInformation(token, info_class, buffer, len(buffer), ctypes.byref(size))
    return buffer
