"""The egress fence's WFP filter plans, checked as data against what Microsoft documents
(stockade/windows/wfp.py), and the fence's Win32 ABI against mingw-w64's headers and import
libraries (fwpstructs.py, fenceapi.py, the constants of wfp.py and fenceapi.py).

The plans' meaning is checked with `blocks`, a model of WFP's documented arbitration for
filters like these ("Filter Arbitration": within our sublayer a matching block filter blocks,
and a block is final; FWPM_FILTER0: a filter matches when all its conditions do): the
`allowlist` plan leaves its package SID TCP to 127.0.0.1:PORT and nothing else, the `any` plan
refuses every range of Linux's destination guard and the host itself, and neither touches
another package's traffic."""

from __future__ import annotations

import ctypes
import functools
import inspect
import ipaddress
import os
import shutil
import subprocess
import uuid

import pytest
import windows_abi
from conftest import unavailable
from test_windows_abi import GCC, NM, compile_c

from stockade.net import addresses
from stockade.windows import fenceapi, fwpstructs, wfp, wfpengine
from stockade.windows import sid as sids

SID = "S-1-15-2-2067022373-1386325468-3431155434-2426632640-3089004462-2553425549-105248742"
OTHER = "S-1-15-2-9-8-7-6-5-4-3"
PORT = 50123

# fwpmu.h, as the Windows SDK's DEFINE_GUID lines write them (Microsoft's win32metadata lists
# the same values): transcribed here a second time, in the header's form, against a typo.
SDK_GUIDS = {
    "FWPM_LAYER_ALE_AUTH_CONNECT_V4": (0xc38d57d1, 0x05a7, 0x4c33, 0x90, 0x4f, 0x7f, 0xbc, 0xee,
                                       0xe6, 0x0e, 0x82),
    "FWPM_LAYER_ALE_AUTH_CONNECT_V6": (0x4a72393b, 0x319f, 0x44bc, 0x84, 0xc3, 0xba, 0x54, 0xdc,
                                       0xb3, 0xb6, 0xb4),
    "FWPM_LAYER_ALE_AUTH_RECV_ACCEPT_V4": (0xe1cd9fe7, 0xf4b5, 0x4273, 0x96, 0xc0, 0x59, 0x2e,
                                           0x48, 0x7b, 0x86, 0x50),
    "FWPM_LAYER_ALE_AUTH_RECV_ACCEPT_V6": (0xa3b42c97, 0x9f04, 0x4672, 0xb8, 0x7e, 0xce, 0xe9,
                                           0xc4, 0x83, 0x25, 0x7f),
    "FWPM_CONDITION_ALE_PACKAGE_ID": (0x71bc78fa, 0xf17c, 0x4997, 0xa6, 0x02, 0x6a, 0xbb, 0x26,
                                      0x1f, 0x35, 0x1c),
    "FWPM_CONDITION_IP_REMOTE_ADDRESS": (0xb235ae9a, 0x1d64, 0x49b8, 0xa4, 0x4c, 0x5f, 0xf3,
                                         0xd9, 0x09, 0x50, 0x45),
    "FWPM_CONDITION_IP_REMOTE_PORT": (0xc35a604d, 0xd22b, 0x4e1a, 0x91, 0xb4, 0x68, 0xf6, 0x74,
                                      0xee, 0x67, 0x4b),
    "FWPM_CONDITION_IP_PROTOCOL": (0x3971ef2b, 0x623e, 0x4f9a, 0x8c, 0xb1, 0x6e, 0x79, 0xb8,
                                   0x06, 0xb9, 0xa7),
    "FWPM_CONDITION_FLAGS": (0x632ce23b, 0x5167, 0x435c, 0x86, 0xd7, 0xe9, 0x03, 0x68, 0x4a,
                             0xa8, 0x0c),
}
# "Filtering conditions available at each filtering layer" (Microsoft): what the plans use.
AVAILABLE = {layer: {"ALE_PACKAGE_ID", "IP_REMOTE_ADDRESS", "IP_REMOTE_PORT", "IP_PROTOCOL",
                     "FLAGS"} for layer in wfp.LAYERS}


def sdk_guid(name: str) -> uuid.UUID:
    first, second, third, *rest = SDK_GUIDS[name]
    return uuid.UUID(fields=(first, second, third, rest[0], rest[1],
                             int.from_bytes(bytes(rest[2:]), "big")))


def test_layers_and_fields_are_the_sdks():
    for name, value in wfp.LAYERS.items():
        assert value == sdk_guid(f"FWPM_LAYER_{name}")
    for name, value in wfp.FIELDS.items():
        assert value == sdk_guid(f"FWPM_CONDITION_{name}")
    assert wfp.PROVIDER not in {*wfp.LAYERS.values(), *wfp.FIELDS.values(), wfp.SUBLAYER}


# --- what the plans mean -----------------------------------------------------------------------

network = functools.cache(ipaddress.ip_network)


def matches(condition: wfp.Condition, seen: dict) -> bool:
    value = seen[condition.field]
    if condition.field == "IP_REMOTE_ADDRESS":
        address = ipaddress.ip_address(value)
        equal = address.version == network(condition.value).version \
            and address in network(condition.value)
    elif condition.field == "ALE_PACKAGE_ID":
        equal = value.upper() == str(condition.value).upper()
    elif condition.match == "flags_all_set":
        return value & condition.value == condition.value
    else:
        equal = value == condition.value
    return {"equal": equal, "not_equal": not equal}[condition.match]


def blocks(plan: tuple[wfp.Filter, ...], layer: str, **seen: object) -> bool:
    """Whether WFP would block a classification at `layer` with these field values."""
    seen = {"FLAGS": 0, "IP_PROTOCOL": wfp.IPPROTO_TCP, "IP_REMOTE_PORT": 443,
            "ALE_PACKAGE_ID": SID} | seen
    return any(f.layer == layer and f.action == wfp.FWP_ACTION_BLOCK
               and all(matches(c, seen) for c in f.conditions) for f in plan)


def connect(plan: tuple[wfp.Filter, ...], address: str, **seen: object) -> bool:
    """Whether a connection to `address` is blocked (at the layer of its family)."""
    layer = f"ALE_AUTH_CONNECT_V{ipaddress.ip_address(address).version}"
    return blocks(plan, layer, IP_REMOTE_ADDRESS=address, **seen)


def test_the_allowlist_plan_is_exactly_this():
    package = wfp.Condition("ALE_PACKAGE_ID", "equal", SID)
    assert wfp.allowlist_plan(SID, PORT) == (
        wfp.Filter("ALE_AUTH_CONNECT_V4", (package, wfp.Condition(
            "IP_REMOTE_ADDRESS", "not_equal", "127.0.0.1")), "not_the_proxy_address"),
        wfp.Filter("ALE_AUTH_CONNECT_V4", (package, wfp.Condition(
            "IP_REMOTE_PORT", "not_equal", PORT)), "not_the_proxy_port"),
        wfp.Filter("ALE_AUTH_CONNECT_V4", (package, wfp.Condition(
            "IP_PROTOCOL", "not_equal", 6)), "not_tcp"),
        wfp.Filter("ALE_AUTH_CONNECT_V6", (package,), "ipv6"),
        wfp.Filter("ALE_AUTH_RECV_ACCEPT_V4", (package,), "inbound"),
        wfp.Filter("ALE_AUTH_RECV_ACCEPT_V6", (package,), "inbound"),
    )


def test_the_allowlist_plan_leaves_the_proxy_alone_and_nothing_else():
    plan = wfp.allowlist_plan(SID, PORT)
    assert not connect(plan, "127.0.0.1", IP_REMOTE_PORT=PORT)
    for address, port, protocol in (("127.0.0.1", PORT + 1, 6), ("127.0.0.1", 445, 6),
                                    ("127.0.0.1", PORT, 17), ("127.0.0.2", PORT, 6),
                                    ("192.168.1.20", PORT, 6), ("169.254.169.254", 80, 6),
                                    ("8.8.8.8", 53, 17), ("::1", PORT, 6),
                                    ("::ffff:127.0.0.1", PORT, 6), ("2001:db8::1", 443, 6)):
        assert connect(plan, address, IP_REMOTE_PORT=port, IP_PROTOCOL=protocol), address
    for layer in ("ALE_AUTH_RECV_ACCEPT_V4", "ALE_AUTH_RECV_ACCEPT_V6"):
        assert blocks(plan, layer, IP_REMOTE_ADDRESS="127.0.0.1")
    # another AppContainer, or any other process, is none of the plan's business
    assert not connect(plan, "127.0.0.2", ALE_PACKAGE_ID=OTHER)
    assert not blocks(plan, "ALE_AUTH_RECV_ACCEPT_V4", ALE_PACKAGE_ID=OTHER,
                      IP_REMOTE_ADDRESS="127.0.0.1")


@pytest.mark.parametrize("port", [0, 65536, True, "50123", None])
def test_a_proxy_port_that_is_none_is_refused(port):
    with pytest.raises(ValueError):
        wfp.allowlist_plan(SID, port)


def test_the_any_plan_refuses_every_range_of_the_guard_and_the_host():
    plan = wfp.any_plan(SID)
    for network, kind in addresses.guarded_networks():
        for address in (network[0], network[-1]):
            assert connect(plan, str(address)), (network, kind)
    assert connect(plan, "93.184.216.34", FLAGS=wfp.FWP_CONDITION_FLAG_IS_LOOPBACK)
    assert connect(plan, "2606:4700::1", FLAGS=wfp.FWP_CONDITION_FLAG_IS_LOOPBACK)
    for public in ("93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808"):
        assert not connect(plan, public), public
    for documentation in ("192.0.2.1", "2001:db8::1"):  # (as Linux's guard lets them by)
        assert not connect(plan, documentation)
    for link_local in ("169.254.1.1", "fe80::1"):
        assert not connect(plan, link_local, ALE_PACKAGE_ID=OTHER)
    assert {f.kind for f in plan} >= {"link_local", "metadata", "private", "loopback",
                                      "reserved", "host", "inbound"}


@pytest.mark.parametrize("plan", [wfp.allowlist_plan(SID, PORT), wfp.any_plan(SID)],
                         ids=["allowlist", "any"])
def test_every_filter_is_a_hard_block_of_the_one_package_in_stockades_sublayer(plan):
    assert 0 < len(plan) <= wfp.MAX_FILTERS
    for one in plan:
        assert one.action == wfp.FWP_ACTION_BLOCK
        assert one.flags == wfp.FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT
        assert 0 <= one.weight <= 15  # a weight range index (FWP_UINT8)
        assert one.conditions[0] == wfp.Condition("ALE_PACKAGE_ID", "equal", SID)
        fields = [c.field for c in one.conditions]
        assert len(set(fields)) == len(fields)  # distinct fields: ANDed, never ORed
        assert set(fields) <= AVAILABLE[one.layer]
        for condition in one.conditions:
            kind = wfp.value_type(condition)
            if condition.match == "flags_all_set":
                assert kind == wfp.FWP_UINT32
            if condition.match == "not_equal":  # scalars only
                assert kind in (wfp.FWP_UINT8, wfp.FWP_UINT16, wfp.FWP_UINT32)
            if condition.field == "IP_REMOTE_ADDRESS":
                version = ipaddress.ip_network(condition.value).version
                assert one.layer.endswith(f"V{version}")
    assert wfp.SUBLAYER_WEIGHT == 0xFFFF


# --- the structures Windows is handed ---------------------------------------------------------

def decoded(made: fwpstructs.FWPM_FILTER0) -> dict:
    """What Windows reads from an FWPM_FILTER0 (through the pointers, as the engine does)."""
    def read_guid(value: fwpstructs.GUID) -> uuid.UUID:
        return uuid.UUID(bytes_le=bytes(value))

    conditions = []
    array = (fwpstructs.FWPM_FILTER_CONDITION0 * made.numFilterConditions).from_address(
        made.filterCondition)
    for slot in array:
        kind, raw = slot.conditionValue.type, slot.conditionValue.uint64
        if kind == wfp.FWP_SID:
            value: object = sids.from_bytes(ctypes.string_at(raw, 68))[0]
        elif kind == wfp.FWP_V4_ADDR_MASK:
            mask = fwpstructs.FWP_V4_ADDR_AND_MASK.from_address(raw)
            value = (str(ipaddress.IPv4Address(mask.addr)), str(ipaddress.IPv4Address(mask.mask)))
        elif kind == wfp.FWP_V6_ADDR_MASK:
            mask = fwpstructs.FWP_V6_ADDR_AND_MASK.from_address(raw)
            value = (str(ipaddress.IPv6Address(bytes(mask.addr))), mask.prefixLength)
        else:
            value = raw
        conditions.append((read_guid(slot.fieldKey), slot.matchType, kind, value))
    return {"key": read_guid(made.filterKey), "layer": read_guid(made.layerKey),
            "sublayer": read_guid(made.subLayerKey),
            "provider": read_guid(fwpstructs.GUID.from_address(made.providerKey)),
            "weight": (made.weight.type, made.weight.uint64), "flags": made.flags,
            "action": made.action.type, "conditions": conditions,
            "name": ctypes.wstring_at(made.displayData.name)}


def test_a_plan_becomes_the_structures_windows_reads():
    keep: list = []
    key = str(uuid.uuid4())
    plan = wfp.allowlist_plan(SID, PORT)
    seen = decoded(wfpengine.filter_struct(plan[0], key, keep))
    assert seen == {
        "key": uuid.UUID(key), "layer": wfp.LAYERS["ALE_AUTH_CONNECT_V4"],
        "sublayer": wfp.SUBLAYER, "provider": wfp.PROVIDER, "weight": (wfp.FWP_UINT8, 15),
        "flags": wfp.FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT, "action": wfp.FWP_ACTION_BLOCK,
        "conditions": [(wfp.FIELDS["ALE_PACKAGE_ID"], wfp.FWP_MATCH_EQUAL, wfp.FWP_SID, SID),
                       (wfp.FIELDS["IP_REMOTE_ADDRESS"], wfp.FWP_MATCH_NOT_EQUAL,
                        wfp.FWP_UINT32, 0x7F000001)],  # host order
        "name": "Stockade egress fence: not_the_proxy_address"}
    assert decoded(wfpengine.filter_struct(plan[1], key, keep))["conditions"][1] == (
        wfp.FIELDS["IP_REMOTE_PORT"], wfp.FWP_MATCH_NOT_EQUAL, wfp.FWP_UINT16, PORT)
    assert decoded(wfpengine.filter_struct(plan[2], key, keep))["conditions"][1] == (
        wfp.FIELDS["IP_PROTOCOL"], wfp.FWP_MATCH_NOT_EQUAL, wfp.FWP_UINT8, 6)
    guarded = {f.conditions[1].value: f for f in wfp.any_plan(SID) if len(f.conditions) > 1
               and f.conditions[1].field == "IP_REMOTE_ADDRESS"}
    assert decoded(wfpengine.filter_struct(guarded["169.254.0.0/16"], key, keep))[
        "conditions"][1][2:] == (wfp.FWP_V4_ADDR_MASK, ("169.254.0.0", "255.255.0.0"))
    assert decoded(wfpengine.filter_struct(guarded["fe80::/10"], key, keep))[
        "conditions"][1][2:] == (wfp.FWP_V6_ADDR_MASK, ("fe80::", 10))
    host = next(f for f in wfp.any_plan(SID) if f.kind == "host")
    assert decoded(wfpengine.filter_struct(host, key, keep))["conditions"][1] == (
        wfp.FIELDS["FLAGS"], wfp.FWP_MATCH_FLAGS_ALL_SET, wfp.FWP_UINT32, 1)


# --- the ABI, against mingw-w64 -----------------------------------------------------------------

# Constants of wfp.py and fenceapi.py, each compared with the header's; but one that mingw-w64
# lacks (Microsoft's value: FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT is 0x00000008 in fwpmtypes.h)
# and IPPROTO_TCP (IANA's protocol number 6; ws2def.h cannot follow windows.h here).
HEADERS = ("fwpmu.h", "psapi.h")
HEADER_EXPRESSIONS = {"TOKEN_INTEGRITY_LEVEL": "TokenIntegrityLevel"}
NOT_IN_MINGW = {"FWPM_FILTER_FLAG_CLEAR_ACTION_RIGHT", "IPPROTO_TCP"}


def fence_constants() -> dict[str, int]:
    values = {}
    for module in (wfp, fenceapi):
        for name, value in vars(module).items():
            if name.isupper() and type(value) is int and name not in (
                    "FILTER_WEIGHT", "SUBLAYER_WEIGHT", "MAX_FILTERS") \
                    and name not in NOT_IN_MINGW:
                values[name] = value
    return values


def fence_source(**replaced: object) -> str:
    layouts = windows_abi.Layouts(inspect.getsource(fwpstructs)).all()
    functions = [name for name, (dll, *_) in fenceapi.SIGNATURES.items() if dll != "firewallapi"]
    source = windows_abi.c_source(
        layouts=replaced.get("layouts", layouts),
        values=replaced.get("values", fence_constants()),
        functions=replaced.get("functions", functions), headers=HEADERS)
    for name, expression in HEADER_EXPRESSIONS.items():
        source = source.replace(f"({name})", f"({expression})")
    return source


@pytest.fixture(scope="module")
def gcc() -> str:
    path = shutil.which(GCC)
    if not path:
        unavailable(f"{GCC} is missing (Debian: apt-get install mingw-w64)")
    return path


def test_the_fences_abi_matches_the_sdk_headers(gcc, tmp_path):
    source = fence_source()
    assert "_Static_assert(sizeof(FWPM_FILTER0) == 200" in source
    assert '"FWP_MATCH_NOT_EQUAL"' in source and '"PIPE_REJECT_REMOTE_CLIENTS"' in source
    done = compile_c(gcc, source, tmp_path, "-c")
    assert done.returncode == 0, done.stderr


def test_a_wrong_fence_constant_or_layout_fails_the_check(gcc, tmp_path):
    done = compile_c(gcc, fence_source(values=fence_constants() | {"FWP_SID": 12}),
                     tmp_path, "-c")
    assert done.returncode != 0 and '"FWP_SID"' in done.stderr
    source = inspect.getsource(fwpstructs).replace(
        '("providerContextKey", UINT64 * 2)', '("providerContextKey", GUID)')
    layouts = windows_abi.Layouts(source).all()
    done = compile_c(gcc, fence_source(layouts=layouts), tmp_path, "-c")
    assert done.returncode != 0 and "offsetof(FWPM_FILTER0, providerContextKey)" in done.stderr


def test_every_fence_function_is_exported_by_its_dll(gcc):
    nm = shutil.which(NM)
    if not nm:
        unavailable(f"{NM} is missing (Debian: mingw-w64)")
    libraries = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(gcc))),
                             "x86_64-w64-mingw32", "lib")
    if not os.path.isdir(libraries):
        libraries = "/usr/x86_64-w64-mingw32/lib"
    exported: dict[str, set[str]] = {}
    for dll in set(fenceapi.DLLS) - {"firewallapi"}:  # (mingw-w64 has no FirewallAPI.dll)
        listing = subprocess.run([nm, os.path.join(libraries, f"lib{dll}.a")],
                                 capture_output=True, text=True, check=True).stdout
        exported[dll] = {line.split()[-1][len("__imp_"):] for line in listing.splitlines()
                         if line.split() and line.split()[-1].startswith("__imp_")}
    wrong = {name: dll for name, (dll, *_) in fenceapi.SIGNATURES.items()
             if dll != "firewallapi" and name not in exported[dll]}
    assert wrong == {}
    assert {name for name, (dll, *_) in fenceapi.SIGNATURES.items()
            if dll == "firewallapi"} == {"NetworkIsolationGetAppContainerConfig",
                                         "NetworkIsolationSetAppContainerConfig"}
