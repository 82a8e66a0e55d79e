"""The launch-ledger kinds the Windows backend writes, each with its validator and remover:

- `appcontainer`: a profile, named `stockade-ac-<24 hex>` (identity.py); removed by deleting it;
- `winacl`: one DACL change, named by its path, the detail as grants.py writes it; removed by
  reverting it (grants.revert; a shield's by writing back the whole DACL it recorded);
- `winsta`: the launch's entry on a window station of this session, named by the station, the
  detail its package SID; removed by taking that SID's entries off it (desktop.py);
- `brokermanifest`: the manifest written for the launch's broker (manifestfile.py), named by
  its path, the detail the broker's process id and creation time; removed, once that broker has
  ended, if it is still there and is what a host writes (manifestfile.remove_left).

A validator refuses (ValueError) anything its remover could not act on safely, so a tampered or
foreign record is quarantined rather than obeyed: a `winacl` record can only name a canonical
drive path and a *package* SID, never a user's or a group's, so reverting it can only ever remove
entries of an AppContainer.

`KINDS` (validator, remover) are registered with the ledger (removers.register) when this module
is imported on Windows — by the backend, whose handle records them — so that reconciliation
handles these records. The ledger imports no backend; elsewhere a record of these kinds is
foreign and is quarantined. See docs/windows.md.
"""

from __future__ import annotations

import ntpath
import re
import sys
from collections.abc import Callable
from functools import partial

from stockade.lifecycle import removers
from stockade.windows import brokered, desktop, grants, identity, leases, manifestfile, tokens
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.aceplan import GRANT, OVERRIDE, SHIELD
from stockade.windows.acl import DACL_CONTROL, Ace
from stockade.windows.aclstore import WindowsAclStore
from stockade.windows.admission import lexical_refusal

PROFILE_KIND = "appcontainer"
_FILE_ID = re.compile(r"[0-9a-f]{1,16}:[0-9a-f]{1,32}")
_STATION = re.compile(r"[A-Za-z0-9_$-]{1,64}")  # a window station's name: no backslash


def validate_profile(name: str, detail: dict) -> None:
    if not identity.PROFILE_NAME.fullmatch(name) or detail:
        raise ValueError("an appcontainer record names a Stockade profile and has no detail")


def validate_acl(name: str, detail: dict) -> None:
    # Short-name-shaped components were confirmed as long names when the change was made.
    if lexical_refusal(name, long_path=lambda path: path):
        raise ValueError("a winacl record names a canonical drive path")
    shield = detail.get("mode") == SHIELD
    if set(detail) != (grants.SHIELD_KEYS if shield else grants.DETAIL_KEYS):
        raise ValueError("a winacl detail has exactly sid, mode, prior, protected, file_id "
                         "(and a shield's, control)")
    if not (isinstance(detail["sid"], str) and sids.is_appcontainer(detail["sid"])):
        raise ValueError("a winacl record's SID is a package SID")
    if detail["mode"] not in (GRANT, OVERRIDE, SHIELD) \
            or not isinstance(detail["protected"], bool):
        raise ValueError("a winacl record has a known mode and a boolean protection flag")
    if shield and not (type(detail["control"]) is int and not detail["control"] & ~DACL_CONTROL
                       and bool(detail["control"] & c.SE_DACL_PROTECTED)
                       == detail["protected"]):
        raise ValueError("a shield's control holds only DACL control bits, its protection "
                         "flag's among them")
    if not (isinstance(detail["file_id"], str) and _FILE_ID.fullmatch(detail["file_id"])):
        raise ValueError("a winacl record's file id is volume:index in hex")
    prior = detail["prior"]
    if not (isinstance(prior, list) and all(isinstance(text, str) for text in prior)):
        raise ValueError("a winacl record's prior entries are hex strings")
    for text in prior:
        Ace.from_hex(text)  # ValueError if not one ACE


def validate_station(name: str, detail: dict) -> None:
    if not _STATION.fullmatch(name):
        raise ValueError("a winsta record names a window station")
    if set(detail) != {"sid"} or not (isinstance(detail["sid"], str)
                                      and sids.is_appcontainer(detail["sid"])):
        raise ValueError("a winsta record's detail is exactly a package SID")


def validate_manifest(name: str, detail: dict) -> None:
    if lexical_refusal(name, long_path=lambda path: path) \
            or ntpath.basename(ntpath.dirname(name)) != brokered.DIRECTORY \
            or not manifestfile.NAME.fullmatch(ntpath.basename(name)):
        raise ValueError("a brokermanifest record names a manifest in a broker directory")
    if set(detail) != {"broker", "created"} or not all(
            type(detail[key]) is int and 0 < detail[key] < 1 << 64 for key in detail):
        raise ValueError("a brokermanifest detail is exactly its broker's process id and "
                         "creation time")


def remove_manifest(name: str, detail: dict) -> None:
    manifestfile.remove_left(name, detail["broker"], detail["created"],
                             tokens.current_user_sid())


def remove_station(name: str, detail: dict) -> None:
    with leases.briefly(tokens.current_user_sid(), station_lock(name)):
        desktop.change_station(name, partial(desktop.station_revoked, sid=detail["sid"]))


def station_lock(name: str) -> str:
    """What `leases.briefly` serialises a window station's DACL changes under."""
    return f"window-station:{name}"


def remove_profile(name: str, detail: dict) -> None:
    identity.delete_profile(name)


def remove_acl(name: str, detail: dict) -> None:
    grants.revert(name, detail, WindowsAclStore(),
                  partial(leases.briefly, tokens.current_user_sid()))


KINDS: dict[str, tuple[Callable[[str, dict], None], Callable[[str, dict], None]]] = {
    PROFILE_KIND: (validate_profile, remove_profile),
    grants.KIND: (validate_acl, remove_acl),
    desktop.STATION_KIND: (validate_station, remove_station),
    manifestfile.KIND: (validate_manifest, remove_manifest),
}


def register_kinds() -> None:
    """Make the ledger validate and reconcile these kinds (the owner registers its own)."""
    for kind, (validator, remover) in KINDS.items():
        removers.register(kind, validator, remover)


if sys.platform == "win32":
    register_kinds()
