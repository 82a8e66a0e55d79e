"""The egress fence's Windows Filtering Platform filters, as data: what the fence service
(fence.py) adds for one launch's AppContainer, keyed to its package SID, in a provider and
sublayer of Stockade's own. Pure: wfpengine.py turns a plan into FWPM_FILTER0 structures.

Every filter **blocks**; none permits, so a plan can only take reachability away from the one
package SID it names, never give any (what Windows grants an AppContainer is its capabilities'
and, for `allowlist`, the loopback exemption's). Each filter's conditions name distinct fields,
which WFP ANDs ("all conditions must be true for the action to be taken": FWPM_FILTER0).

- `allowlist_plan(sid, port)`: at FWPM_LAYER_ALE_AUTH_CONNECT_V4, anything of `sid` that is not
  TCP to 127.0.0.1:`port` (three filters: another address, another port, another protocol,
  each with FWP_MATCH_NOT_EQUAL); at ..._CONNECT_V6, everything of `sid` (the proxy listens on
  IPv4 loopback only); at ..._RECV_ACCEPT_V4/V6, everything of `sid` (nothing connects in).
  With the loopback exemption this leaves the launch exactly Stockade's proxy.
- `any_plan(sid)`: at ..._CONNECT_V4/V6, one filter per range of the destination guard
  (stockade.net.addresses.guarded_networks: loopback, link-local, metadata, private, reserved,
  IPv6 outside global unicast and the forms that carry a guarded IPv4 address) and one for
  traffic WFP flags as loopback (FWP_CONDITION_FLAG_IS_LOOPBACK: the host itself, whichever of
  its addresses is dialled); at ..._RECV_ACCEPT_V4/V6, everything of `sid`.

Arbitration (Microsoft, "Filter Arbitration"): sublayers are evaluated from the highest weight
down, a block is final, and only a *hard* permit of a higher sublayer could stop a block below
it; so the sublayer has the highest weight there is (`SUBLAYER_WEIGHT`), and each filter clears
its action right (FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT: a hard block, which a filter block is by
default anyway). Values are as Windows takes them: an IPv4 address and mask as a host-order
UINT32 (FWP_V4_ADDR_AND_MASK), an IPv6 address as its 16 bytes in network order with a prefix
length (FWP_V6_ADDR_AND_MASK), a port as UINT16, the protocol as UINT8.

The GUIDs are the Windows SDK's (fwpmu.h; Microsoft's win32metadata lists the same values);
the enumerations and flags are checked against mingw-w64's fwptypes.h where it defines them
(tests/test_windows_wfp.py).
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass

from stockade.net import addresses

# Filtering layers (fwpmu.h).
LAYERS = {
    "ALE_AUTH_CONNECT_V4": uuid.UUID("c38d57d1-05a7-4c33-904f-7fbceee60e82"),
    "ALE_AUTH_CONNECT_V6": uuid.UUID("4a72393b-319f-44bc-84c3-ba54dcb3b6b4"),
    "ALE_AUTH_RECV_ACCEPT_V4": uuid.UUID("e1cd9fe7-f4b5-4273-96c0-592e487b8650"),
    "ALE_AUTH_RECV_ACCEPT_V6": uuid.UUID("a3b42c97-9f04-4672-b87e-cee9c483257f"),
}
# Filtering condition identifiers (fwpmu.h), each with the FWP_DATA_TYPE its value has here.
FIELDS = {
    "ALE_PACKAGE_ID": uuid.UUID("71bc78fa-f17c-4997-a602-6abb261f351c"),
    "IP_REMOTE_ADDRESS": uuid.UUID("b235ae9a-1d64-49b8-a44c-5ff3d9095045"),
    "IP_REMOTE_PORT": uuid.UUID("c35a604d-d22b-4e1a-91b4-68f674ee674b"),
    "IP_PROTOCOL": uuid.UUID("3971ef2b-623e-4f9a-8cb1-6e79b806b9a7"),
    "FLAGS": uuid.UUID("632ce23b-5167-435c-86d7-e903684aa80c"),
}

# FWP_DATA_TYPE, FWP_MATCH_TYPE, actions and flags (fwptypes.h, fwpmtypes.h).
FWP_UINT8 = 1
FWP_UINT16 = 2
FWP_UINT32 = 3
FWP_SID = 13
FWP_V4_ADDR_MASK = 0x100
FWP_V6_ADDR_MASK = 0x101
FWP_MATCH_EQUAL = 0
FWP_MATCH_FLAGS_ALL_SET = 6
FWP_MATCH_NOT_EQUAL = 10
FWP_ACTION_BLOCK = 0x1001  # 0x1 | FWP_ACTION_FLAG_TERMINATING
FWP_CONDITION_FLAG_IS_LOOPBACK = 0x00000001
FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT = 0x00000008
IPPROTO_TCP = 6
MATCHES = {"equal": FWP_MATCH_EQUAL, "not_equal": FWP_MATCH_NOT_EQUAL,
           "flags_all_set": FWP_MATCH_FLAGS_ALL_SET}

# Stockade's own provider and sublayer: every filter the fence adds names both, and the fence
# deletes no filter that does not (wfpengine.py).
PROVIDER = uuid.UUID("5f0c9a8e-6b1d-4c2e-9a37-0d4e8b6f2c71")
SUBLAYER = uuid.UUID("a1d7e3c5-2f48-4b96-8e0a-7c3b5d9f1e24")
SUBLAYER_WEIGHT = 0xFFFF  # FWPM_SUBLAYER0.weight is a UINT16: the highest there is
FILTER_WEIGHT = 15  # FWP_UINT8: the top of the 16 weight ranges within the sublayer
LOOPBACK = "127.0.0.1"  # where Stockade's proxy listens on the host
MAX_FILTERS = 256  # a plan is far smaller; a record naming more is not the fence's


@dataclass(frozen=True)
class Condition:
    """One filtering condition: `field` (a FIELDS name), `match` (a MATCHES name) and `value`:
    a package SID (ALE_PACKAGE_ID), an address or network in its text form (IP_REMOTE_ADDRESS),
    a port, a protocol number, or condition flags."""

    field: str
    match: str
    value: str | int


@dataclass(frozen=True)
class Filter:
    """One block filter: its layer (a LAYERS name), its conditions, and why (`kind`: what it
    keeps the launch from)."""

    layer: str
    conditions: tuple[Condition, ...]
    kind: str
    action: int = FWP_ACTION_BLOCK
    weight: int = FILTER_WEIGHT
    flags: int = FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT


def _package(sid: str) -> Condition:
    return Condition("ALE_PACKAGE_ID", "equal", sid)


def _inbound(sid: str) -> tuple[Filter, ...]:
    return tuple(Filter(layer, (_package(sid),), "inbound")
                 for layer in ("ALE_AUTH_RECV_ACCEPT_V4", "ALE_AUTH_RECV_ACCEPT_V6"))


def allowlist_plan(sid: str, port: int) -> tuple[Filter, ...]:
    """The filters that leave the launch of package SID `sid` TCP to 127.0.0.1:`port` alone."""
    if not (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535):
        raise ValueError(f"the proxy's port is 1-65535, not {port!r}")
    v4 = "ALE_AUTH_CONNECT_V4"
    return (
        Filter(v4, (_package(sid), Condition("IP_REMOTE_ADDRESS", "not_equal", LOOPBACK)),
               "not_the_proxy_address"),
        Filter(v4, (_package(sid), Condition("IP_REMOTE_PORT", "not_equal", port)),
               "not_the_proxy_port"),
        Filter(v4, (_package(sid), Condition("IP_PROTOCOL", "not_equal", IPPROTO_TCP)),
               "not_tcp"),
        Filter("ALE_AUTH_CONNECT_V6", (_package(sid),), "ipv6"),
        *_inbound(sid),
    )


def any_plan(sid: str) -> tuple[Filter, ...]:
    """The filters that keep the launch of package SID `sid` from the destination guard's
    ranges and from the host itself."""
    out = [Filter(layer, (_package(sid), Condition("FLAGS", "flags_all_set",
                                                   FWP_CONDITION_FLAG_IS_LOOPBACK)),
                  "host") for layer in ("ALE_AUTH_CONNECT_V4", "ALE_AUTH_CONNECT_V6")]
    for network, kind in addresses.guarded_networks():
        layer = "ALE_AUTH_CONNECT_V4" if network.version == 4 else "ALE_AUTH_CONNECT_V6"
        out.append(Filter(layer, (_package(sid), Condition(
            "IP_REMOTE_ADDRESS", "equal", network.with_prefixlen)), kind))
    return (*out, *_inbound(sid))


def plan_for(mode: str, sid: str, port: int | None) -> tuple[Filter, ...]:
    """The plan of network mode `mode` ("allowlist", with the proxy's `port`, or "any")."""
    if mode == "allowlist":
        return allowlist_plan(sid, port)  # type: ignore[arg-type]  (checked there)
    if mode == "any":
        return any_plan(sid)
    raise ValueError(f"the fence serves network modes allowlist and any, not {mode!r}")


def value_type(condition: Condition) -> int:
    """The FWP_DATA_TYPE of `condition`'s value as wfpengine.py hands it to Windows."""
    if condition.field == "ALE_PACKAGE_ID":
        return FWP_SID
    if condition.field == "IP_REMOTE_PORT":
        return FWP_UINT16
    if condition.field == "IP_PROTOCOL":
        return FWP_UINT8
    if condition.field == "FLAGS":
        return FWP_UINT32
    network = ipaddress.ip_network(condition.value)
    if network.prefixlen == network.max_prefixlen and network.version == 4:
        return FWP_UINT32  # one IPv4 address, host order
    return FWP_V4_ADDR_MASK if network.version == 4 else FWP_V6_ADDR_MASK
