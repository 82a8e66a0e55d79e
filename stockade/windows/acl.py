"""Access-control lists as data: ACEs in their binary form, whole ACLs, and the inheritance
rules Windows applies when an ACL flows from a directory to what it contains.

An `Ace` keeps its type, flags and body (everything after the 4-byte header) verbatim, so an ACL
read from disk is written back byte for byte, whatever ACE types it holds; the access mask and,
for the plain allow/deny types, the SID are read from the body. A `Dacl` is what an object's
security descriptor holds: every ACE (explicit, then inherited, as read) and whether inheritance
from the parent is blocked (SE_DACL_PROTECTED).
"""

from __future__ import annotations

from dataclasses import dataclass

from stockade.windows import constants as c
from stockade.windows import sid as sids

ALLOW, DENY = 0x0, 0x1
OBJECT_INHERIT, CONTAINER_INHERIT, NO_PROPAGATE, INHERIT_ONLY, INHERITED = 0x1, 0x2, 0x4, 0x8, 0x10
_INHERITANCE = OBJECT_INHERIT | CONTAINER_INHERIT | NO_PROPAGATE | INHERIT_ONLY
CREATOR_OWNER, CREATOR_GROUP = "S-1-3-0", "S-1-3-1"
# The file objects' generic mapping: what GENERIC_* in an access mask means on a file.
_GENERIC = ((c.GENERIC_READ, c.FILE_GENERIC_READ), (c.GENERIC_WRITE, c.FILE_GENERIC_WRITE),
            (c.GENERIC_EXECUTE, c.FILE_GENERIC_EXECUTE), (c.GENERIC_ALL, c.FILE_ALL_ACCESS))
_GENERIC_BITS = c.GENERIC_READ | c.GENERIC_WRITE | c.GENERIC_EXECUTE | c.GENERIC_ALL
_SID_TYPES = {0x0, 0x1, 0x9, 0xA}  # allowed, denied, and their callback forms: mask, then SID
_OBJECT_TYPES = {0x5, 0x6, 0x7, 0x8, 0xB, 0xC, 0xF, 0x10}  # need ACL_REVISION_DS
ACL_REVISION, ACL_REVISION_DS = 2, 4


@dataclass(frozen=True)
class Ace:
    type: int
    flags: int
    body: bytes

    @classmethod
    def allow(cls, sid: str, mask: int, flags: int = 0) -> Ace:
        return cls(ALLOW, flags, mask.to_bytes(4, "little") + sids.to_bytes(sid))

    @property
    def mask(self) -> int:
        return int.from_bytes(self.body[:4], "little")

    @property
    def sid(self) -> str:
        """The trustee of an allow/deny ACE; "" for ACE types that carry none here."""
        return sids.from_bytes(self.body[4:])[0] if self.type in _SID_TYPES else ""

    @property
    def inherited(self) -> bool:
        return bool(self.flags & INHERITED)

    @property
    def effective(self) -> bool:
        """Whether it applies to the object it is on (not inherit-only)."""
        return not self.flags & INHERIT_ONLY

    def with_flags(self, flags: int) -> Ace:
        return Ace(self.type, flags, self.body)

    def with_mask(self, mask: int) -> Ace:
        return Ace(self.type, self.flags, mask.to_bytes(4, "little") + self.body[4:])

    def encode(self) -> bytes:
        return bytes([self.type, self.flags]) + (4 + len(self.body)).to_bytes(2, "little") \
            + self.body

    def hex(self) -> str:
        return self.encode().hex()

    @classmethod
    def from_hex(cls, text: str) -> Ace:
        data = bytes.fromhex(text)
        (ace,) = decode_aces(data, 1)
        if len(ace.encode()) != len(data):
            raise ValueError("trailing bytes after the ACE")
        return ace


@dataclass(frozen=True)
class Dacl:
    aces: tuple[Ace, ...]
    protected: bool = False
    # SE_DACL_AUTO_INHERITED: the DACL was set up for automatic propagation (SetSecurityInfo
    # and files made by inheritance have it; a DACL written by SetFileSecurity may not).
    auto_inherited: bool = True

    @property
    def explicit(self) -> tuple[Ace, ...]:
        return tuple(a for a in self.aces if not a.inherited)

    @property
    def control(self) -> int:
        """Its security descriptor's control bits that concern the DACL (beyond its presence)."""
        return (c.SE_DACL_PROTECTED if self.protected else 0) | (
            c.SE_DACL_AUTO_INHERITED if self.auto_inherited else 0)

    @classmethod
    def with_control(cls, aces: tuple[Ace, ...], control: int) -> Dacl:
        return cls(aces, bool(control & c.SE_DACL_PROTECTED),
                   bool(control & c.SE_DACL_AUTO_INHERITED))


DACL_CONTROL = c.SE_DACL_PROTECTED | c.SE_DACL_AUTO_INHERITED  # the bits `Dacl.control` holds
_HEADER = 20  # SECURITY_DESCRIPTOR_RELATIVE


def self_relative(dacl: Dacl) -> bytes:
    """A self-relative security descriptor holding `dacl` verbatim — every entry, inherited
    ones too, in its order, and its control bits — and no owner, group or SACL (which
    SetKernelObjectSecurity with DACL_SECURITY_INFORMATION leaves as they are)."""
    control = c.SE_SELF_RELATIVE | c.SE_DACL_PRESENT | dacl.control
    return bytes([c.SECURITY_DESCRIPTOR_REVISION, 0]) + control.to_bytes(2, "little") \
        + bytes(12) + _HEADER.to_bytes(4, "little") + encode(dacl.aces)


def encode(aces: tuple[Ace, ...] | list[Ace]) -> bytes:
    """A binary ACL holding `aces` in order (ACL_REVISION_DS when an object ACE needs it)."""
    body = b"".join(a.encode() for a in aces)
    revision = ACL_REVISION_DS if any(a.type in _OBJECT_TYPES for a in aces) else ACL_REVISION
    size = 8 + len(body)
    if size > 0xFFFF or len(aces) > 0xFFFF:
        raise ValueError("ACL too large")
    return bytes([revision, 0]) + size.to_bytes(2, "little") \
        + len(aces).to_bytes(2, "little") + b"\0\0" + body


def decode(data: bytes) -> tuple[Ace, ...]:
    """The ACEs of a binary ACL; ValueError if it is malformed."""
    if len(data) < 8 or data[0] not in (ACL_REVISION, ACL_REVISION_DS):
        raise ValueError("not a binary ACL")
    size = int.from_bytes(data[2:4], "little")
    if size < 8 or size > len(data):
        raise ValueError("ACL size out of range")
    return decode_aces(data[8:size], int.from_bytes(data[4:6], "little"))


def decode_aces(data: bytes, count: int) -> tuple[Ace, ...]:
    aces, offset = [], 0
    for _ in range(count):
        if offset + 8 > len(data):
            raise ValueError("truncated ACE")
        size = int.from_bytes(data[offset + 2:offset + 4], "little")
        if size < 8 or size % 4 or offset + size > len(data):
            raise ValueError("ACE size out of range")
        ace = Ace(data[offset], data[offset + 1], bytes(data[offset + 4:offset + size]))
        if ace.type in _SID_TYPES:
            sids.from_bytes(ace.body[4:])  # a malformed SID is a malformed ACL
        aces.append(ace)
        offset += size
    return tuple(aces)


def mapped(mask: int) -> int:
    """`mask` with its generic rights replaced by the file rights they stand for."""
    out = mask & ~_GENERIC_BITS
    for generic, specific in _GENERIC:
        if mask & generic:
            out |= specific
    return out


def inherit(parent: tuple[Ace, ...], is_dir: bool, owner: str = "",
            group: str = "") -> tuple[Ace, ...]:
    """The ACEs an object inherits from its parent's DACL, marked INHERITED: Windows' rules for
    OBJECT_INHERIT, CONTAINER_INHERIT, NO_PROPAGATE_INHERIT and INHERIT_ONLY ("ACE inheritance
    rules"), and what it does with generic information: an inherited entry that is effective on
    the object has its generic rights mapped to file rights and CREATOR OWNER / CREATOR GROUP
    replaced by the object's `owner` / `group` (left as they are when not given); one that must
    also pass generic information on is split in two — the mapped effective entry, then an
    inherit-only copy keeping the generic form (as icacls shows `(I)(RX)` followed by
    `(I)(OI)(CI)(IO)(GR,GE)` below C:\\Program Files)."""
    out = []
    for ace in parent:
        flags = ace.flags & _INHERITANCE
        if is_dir and flags & CONTAINER_INHERIT:
            new = 0 if flags & NO_PROPAGATE else flags & ~INHERIT_ONLY
        elif is_dir and flags & OBJECT_INHERIT and not flags & NO_PROPAGATE:
            new = OBJECT_INHERIT | INHERIT_ONLY  # passes down to the files below
        elif not is_dir and flags & OBJECT_INHERIT:
            new = 0
        else:
            continue
        if new & INHERIT_ONLY:
            out.append(ace.with_flags(new | INHERITED))
            continue
        effective = _specific(ace, owner, group)
        if effective == ace or not new & (OBJECT_INHERIT | CONTAINER_INHERIT):
            out.append(effective.with_flags(new | INHERITED))
        else:
            out.append(effective.with_flags(INHERITED))
            out.append(ace.with_flags(new | INHERIT_ONLY | INHERITED))
    return tuple(out)


def _specific(ace: Ace, owner: str, group: str) -> Ace:
    """`ace` as it is effective on an object: generic rights mapped, creator SIDs replaced."""
    if ace.type not in _SID_TYPES:
        return ace
    out = ace.with_mask(mapped(ace.mask))
    creator = {CREATOR_OWNER: owner, CREATOR_GROUP: group}.get(ace.sid)
    if creator:
        out = Ace(ace.type, ace.flags, out.body[:4] + sids.to_bytes(creator))
    return out


def allowed(aces: tuple[Ace, ...], sid: str) -> int:
    """The rights `aces` allow `sid` on the object they are on (generic rights as the file
    rights they stand for). Denials are not subtracted: an AppContainer's package SID is
    matched by allow entries only (see docs/windows.md)."""
    mask = 0
    for ace in aces:
        if ace.type == ALLOW and ace.effective and ace.sid == sid:
            mask |= mapped(ace.mask)
    return mask
