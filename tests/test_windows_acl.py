"""SIDs and ACLs as bytes, and Windows' inheritance rules, against documented layouts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_windows_fakes import PACKAGE, SYSTEM, USERS

from stockade.windows import acl
from stockade.windows import sid as sids
from stockade.windows.acl import Ace

OI, CI, NP, IO, INH = (acl.OBJECT_INHERIT, acl.CONTAINER_INHERIT, acl.NO_PROPAGATE,
                       acl.INHERIT_ONLY, acl.INHERITED)


@pytest.mark.parametrize(("text", "hex_bytes"), [
    ("S-1-5-18", "010100000000000512000000"),                   # LocalSystem
    ("S-1-5-32-544", "01020000000000052000000020020000"),       # BUILTIN\Administrators
    ("S-1-15-2-1", "010200000000000f0200000001000000"),         # ALL APPLICATION PACKAGES
    ("S-1-1-0", "010100000000000100000000"),                    # Everyone
    ("S-1-16-4096", "010100000000001000100000"),                # Low mandatory level
])
def test_well_known_sids_encode_to_their_documented_bytes(text, hex_bytes):
    assert sids.to_bytes(text).hex() == hex_bytes
    assert sids.from_bytes(bytes.fromhex(hex_bytes)) == (text, len(hex_bytes) // 2)


def test_an_authority_of_32_bits_or_more_is_written_in_hex():
    data = bytes([1, 1]) + (1 << 40).to_bytes(6, "big") + (7).to_bytes(4, "little")
    assert sids.from_bytes(data)[0] == "S-1-0x010000000000-7"
    assert sids.to_bytes("S-1-0x010000000000-7") == data


@pytest.mark.parametrize("bad", ["", "S-1", "S-2-5-18", "S-1-5-4294967296", "s-1-5-18",
                                 "S-1-5-18 ", "S-1-5-" + "-".join(["1"] * 16),
                                 "S-1-0x1000000000000"])
def test_malformed_sid_strings_are_refused(bad):
    with pytest.raises(ValueError):
        sids.to_bytes(bad)


@pytest.mark.parametrize("bad", [b"", b"\x02\x01" + bytes(10), b"\x01\x02" + bytes(10),
                                 b"\x01\x10" + bytes(70)])
def test_malformed_binary_sids_are_refused(bad):
    with pytest.raises(ValueError):
        sids.from_bytes(bad)


@given(st.integers(0, (1 << 48) - 1), st.lists(st.integers(0, (1 << 32) - 1), max_size=15))
def test_sid_string_and_binary_forms_round_trip(authority, subs):
    data = bytes([1, len(subs)]) + authority.to_bytes(6, "big") + b"".join(
        s.to_bytes(4, "little") for s in subs)
    text, size = sids.from_bytes(data + b"trailing")
    assert size == len(data) and sids.to_bytes(text) == data


def test_only_package_sids_count_as_appcontainer_sids():
    assert sids.is_appcontainer(PACKAGE)
    for other in ("S-1-15-2-1", "S-1-15-2-2", "S-1-15-3-1", SYSTEM, USERS, PACKAGE + "-1",
                  "S-1-5-21-1-2-3-4-5-6-7"):
        assert not sids.is_appcontainer(other)


def test_an_allow_ace_has_the_documented_layout():
    # ACCESS_ALLOWED_ACE: type 0, flags OI|CI, size 20, mask FILE_ALL_ACCESS, then S-1-5-18.
    ace = Ace.allow(SYSTEM, 0x1F01FF, OI | CI)
    assert ace.encode().hex() == "00031400ff011f00010100000000000512000000"
    assert (ace.mask, ace.sid, ace.inherited, ace.effective) == (0x1F01FF, SYSTEM, False, True)
    assert Ace.from_hex(ace.hex()) == ace


def test_an_acl_has_the_documented_header_and_decodes_back():
    aces = (Ace.allow(SYSTEM, 0x1F01FF, OI | CI), Ace(acl.DENY, 0, Ace.allow(USERS, 2).body))
    data = acl.encode(aces)
    # AclRevision 2, Sbz1, AclSize, AceCount, Sbz2
    assert data[:8] == bytes([2, 0]) + len(data).to_bytes(2, "little") + b"\x02\x00\x00\x00"
    assert acl.decode(data) == aces


def test_object_aces_are_kept_verbatim_and_raise_the_revision():
    # ACCESS_ALLOWED_OBJECT_ACE (type 5): mask, flags, an object-type GUID, then the SID.
    body = (0x100).to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(range(16)) \
        + sids.to_bytes(SYSTEM)
    ace = Ace(0x5, CI, body)
    data = acl.encode((ace,))
    assert data[0] == acl.ACL_REVISION_DS
    assert acl.decode(data) == (ace,) and ace.sid == ""


@pytest.mark.parametrize("bad", [
    b"", bytes([3, 0, 8, 0, 0, 0, 0, 0]),                         # unknown revision
    bytes([2, 0, 40, 0, 0, 0, 0, 0]),                              # size past the end
    bytes([2, 0, 16, 0, 1, 0, 0, 0]) + bytes([0, 0, 6, 0, 0, 0, 0, 0]),  # ACE size not x4
    bytes([2, 0, 20, 0, 1, 0, 0, 0]) + bytes([0, 0, 12, 0, 1, 0, 0, 0, 9, 9, 9, 9]),  # bad SID
])
def test_malformed_acls_are_refused(bad):
    with pytest.raises(ValueError):
        acl.decode(bad)


def test_from_hex_refuses_trailing_bytes():
    with pytest.raises(ValueError):
        Ace.from_hex(Ace.allow(SYSTEM, 1).hex() + "00")


# The inheritance table of "ACE inheritance rules" (Windows security documentation): what a
# child directory and a child file receive from an ACE with these flags on their parent.
INHERITANCE = [
    (OI | CI, OI | CI | INH, INH),
    (CI, CI | INH, None),
    (OI, OI | IO | INH, INH),
    (OI | CI | NP, INH, INH),
    (CI | NP, INH, None),
    (OI | NP, None, INH),
    (OI | CI | IO, OI | CI | INH, INH),
    (CI | IO, CI | INH, None),
    (OI | IO, OI | IO | INH, INH),
    (0, None, None),
    (IO, None, None),
]


@pytest.mark.parametrize(("flags", "to_dir", "to_file"), INHERITANCE)
def test_inheritance_follows_the_documented_rules(flags, to_dir, to_file):
    parent = (Ace.allow(PACKAGE, 0x1200A9, flags),)
    for is_dir, expected in ((True, to_dir), (False, to_file)):
        got = acl.inherit(parent, is_dir)
        assert [a.flags for a in got] == ([] if expected is None else [expected])
        assert all(a.mask == 0x1200A9 and a.sid == PACKAGE for a in got)


def test_inherited_entries_are_inherited_again_by_the_next_level():
    top = (Ace.allow(PACKAGE, 1, OI | CI), Ace.allow(USERS, 2, OI), Ace.allow(SYSTEM, 4, CI))
    level1 = acl.inherit(top, True)
    level2 = acl.inherit(level1, True)
    assert [(a.sid, a.flags) for a in level2] == [(PACKAGE, OI | CI | INH), (USERS, OI | IO | INH),
                                                  (SYSTEM, CI | INH)]
    assert [a.sid for a in acl.inherit(level2, False)] == [PACKAGE, USERS]


def test_allowed_sums_effective_allow_entries_of_one_sid_and_ignores_denials():
    aces = (Ace.allow(PACKAGE, 0x1, 0), Ace.allow(PACKAGE, 0x2, IO | OI),
            Ace(acl.DENY, 0, Ace.allow(PACKAGE, 0x1).body), Ace.allow(PACKAGE, 0x4, INH),
            Ace.allow(USERS, 0x8, 0))
    assert acl.allowed(aces, PACKAGE) == 0x5


def test_generic_information_is_mapped_where_effective_and_kept_where_passed_on():
    # "ACE inheritance rules": an effective inherited entry has its generic rights mapped and
    # CREATOR OWNER replaced; a container that must pass the entry on gets two — the mapped
    # effective one, then an inherit-only copy keeping the generic form.
    generic = 0x80000000 | 0x20000000  # GENERIC_READ | GENERIC_EXECUTE
    creator = "S-1-3-0"
    parent = (Ace.allow(USERS, generic, OI | CI | IO), Ace.allow(creator, 0x10000000, OI | CI | IO),
              Ace.allow(SYSTEM, 0x1200A9, OI | CI))
    assert [(a.sid, a.mask, a.flags) for a in acl.inherit(parent, True, owner=PACKAGE)] == [
        (USERS, 0x1200A9, INH), (USERS, generic, OI | CI | IO | INH),
        (PACKAGE, 0x1F01FF, INH), (creator, 0x10000000, OI | CI | IO | INH),
        (SYSTEM, 0x1200A9, OI | CI | INH)]
    assert [(a.sid, a.mask, a.flags) for a in acl.inherit(parent, False, owner=PACKAGE)] == [
        (USERS, 0x1200A9, INH), (PACKAGE, 0x1F01FF, INH), (SYSTEM, 0x1200A9, INH)]
    # not passed on (NO_PROPAGATE): only the mapped effective entry
    assert [(a.mask, a.flags) for a in acl.inherit((Ace.allow(USERS, generic, CI | NP),),
                                                   True)] == [(0x1200A9, INH)]
    assert acl.allowed((Ace.allow(USERS, generic),), USERS) == 0x1200A9
    assert acl.mapped(0x10000000 | 0x1) == 0x1F01FF
