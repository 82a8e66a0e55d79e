"""Security identifiers: the string form (`S-1-15-2-…`) and the binary form Windows stores in
ACEs, converted both ways without Win32 (the layout is documented: revision 1, subauthority
count, a 48-bit big-endian identifier authority, then 32-bit little-endian subauthorities)."""

from __future__ import annotations

import re

SYSTEM = "S-1-5-18"
ALL_APP_PACKAGES = "S-1-15-2-1"
ALL_RESTRICTED_APP_PACKAGES = "S-1-15-2-2"
MAX_SUBAUTHORITIES = 15

# A package (AppContainer) SID: authority 15, base RID 2, then seven more subauthorities.
_APPCONTAINER = re.compile(r"S-1-15-2(-[0-9]{1,10}){7}")
_FORM = re.compile(r"S-1-(0x[0-9A-Fa-f]{1,12}|[0-9]{1,15})((?:-[0-9]{1,10}){0,15})")


def to_bytes(sid: str) -> bytes:
    """The binary SID for its string form; ValueError if it is not one."""
    match = _FORM.fullmatch(sid)
    if not match:
        raise ValueError(f"not a SID: {sid[:80]!r}")
    authority = int(match.group(1), 0)
    subs = [int(part) for part in match.group(2).split("-")[1:]]
    if authority >= 1 << 48 or any(sub >= 1 << 32 for sub in subs):
        raise ValueError(f"SID value out of range: {sid[:80]!r}")
    return (bytes([1, len(subs)]) + authority.to_bytes(6, "big")
            + b"".join(sub.to_bytes(4, "little") for sub in subs))


def from_bytes(data: bytes) -> tuple[str, int]:
    """The string form of the binary SID at the start of `data`, and its length in bytes."""
    if len(data) < 8 or data[0] != 1 or data[1] > MAX_SUBAUTHORITIES:
        raise ValueError("not a binary SID")
    size = 8 + 4 * data[1]
    if len(data) < size:
        raise ValueError("truncated binary SID")
    authority = int.from_bytes(data[2:8], "big")
    text = f"S-1-{authority}" if authority < 1 << 32 else f"S-1-0x{authority:012X}"
    subs = (int.from_bytes(data[i:i + 4], "little") for i in range(8, size, 4))
    return text + "".join(f"-{sub}" for sub in subs), size


def is_appcontainer(sid: str) -> bool:
    """True for a package SID, the kind a fresh AppContainer profile has (never a user's)."""
    return bool(_APPCONTAINER.fullmatch(sid))
