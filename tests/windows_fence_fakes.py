"""Models of what the egress fence changes on a Windows host, for its tests on Linux:

- `ModelFirewall`: fence.Firewall as Windows behaves for it: filters kept by key with their
  provider, sublayer, layer and package SID (a plan added all or none, as one WFP transaction;
  deleting a missing key succeeds, one of another provider is refused); the loopback
  exemption list, which holds other entries too and is only ever replaced whole, as
  NetworkIsolationSetAppContainerConfig does; the package SIDs whose processes run (`live`).
  With `path` it keeps itself in a JSON file, so what a crashed process changed survives it,
  and `crash_at` names the change before which that process dies (os._exit).
- `FakeFence`: the Win32 functions wfpengine.py calls (fenceapi.py's, over FakeWin32's memory
  for the SIDs it hands out), as documented: FwpmFilterAdd0 reads the FWPM_FILTER0 it is given,
  through its pointers, inside a transaction that an abort undoes; FwpmFilterGetByKey0 hands
  out a copy that must be given back to FwpmFreeMemory0; the exemption list is read into heap
  memory each SID of which, and the array, must be HeapFree'd once.
- `SocketTransport`: fenceclient.Transport over a socket (the pipe's stand-in).
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import socket
import uuid

from test_windows_fakes import FakeWin32, win32_error

from stockade.lifecycle.removers import RemovalError
from stockade.windows import fenceapi, wfp
from stockade.windows import sid as sids
from stockade.windows.fwpstructs import (
    FWP_V4_ADDR_AND_MASK,
    FWP_V6_ADDR_AND_MASK,
    FWPM_FILTER0,
    FWPM_FILTER_CONDITION0,
    GUID,
)
from stockade.windows.structs import SID_AND_ATTRIBUTES

OURS = {"provider": str(wfp.PROVIDER), "sublayer": str(wfp.SUBLAYER)}


class ModelFirewall:
    def __init__(self, path: str | None = None, crash_at: str = "") -> None:
        self.path = path
        self.crash_at = crash_at
        self.state = {"filters": {}, "exempt": [], "live": []}
        if path and os.path.exists(path):
            with open(path) as f:
                self.state = json.load(f)
        self.fail_adding = False

    def _change(self, step: str) -> None:
        if step == self.crash_at:
            os._exit(9)

    def _save(self) -> None:
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.state, f)

    @property
    def filters(self) -> dict:
        return self.state["filters"]

    @property
    def exempt_list(self) -> list[str]:
        return self.state["exempt"]

    def foreign(self, key: str, sid: str) -> None:
        """A filter of another program's (another provider) for `sid`."""
        self.filters[key] = {"provider": str(uuid.uuid4()), "sublayer": str(uuid.uuid4()),
                             "layer": "ALE_AUTH_CONNECT_V4", "sid": sid}
        self._save()

    def add_filters(self, plan: tuple[wfp.Filter, ...], keys: tuple[str, ...]) -> None:
        self._change("add_filters")
        if self.fail_adding:
            raise OSError(None, "FwpmFilterAdd0: error 0x80320004")  # nothing committed
        for one, key in zip(plan, keys, strict=True):
            self.filters[key] = OURS | {"layer": one.layer,
                                        "sid": str(one.conditions[0].value)}
        self._save()
        self._change("after_filters")

    def delete_filter(self, key: str) -> None:
        found = self.filters.get(key)
        if found is None:
            return
        if {name: found[name] for name in OURS} != OURS:
            raise RemovalError(f"filter {key} is not one of Stockade's fence: kept")
        del self.filters[key]
        self._save()

    def exempt(self, sid: str) -> None:
        self._change("exempt")
        if sid not in self.exempt_list:
            self.state["exempt"] = [*self.exempt_list, sid]  # the whole list, replaced
        self._save()
        self._change("after_exempt")

    def unexempt(self, sid: str) -> None:
        self.state["exempt"] = [one for one in self.exempt_list if one != sid]
        self._save()

    def running(self, sid: str) -> bool:
        return sid in self.state["live"]

    def holders(self, sid: str) -> set[str]:
        """The users whose processes hold `sid` (the model's `owners`: sid -> users)."""
        return set(self.state.get("owners", {}).get(sid, ()))

    def of(self, sid: str) -> list[str]:
        return sorted(key for key, found in self.filters.items() if found["sid"] == sid)


def out(ref, value) -> None:
    ref._obj.value = value


class FakeFence(FakeWin32):
    """fenceapi's functions over an in-memory WFP engine and exemption list (see the module's
    docstring); a FakeWin32 too, for the SIDs wfpengine converts (identity.sid_string)."""

    def __init__(self) -> None:
        super().__init__()
        self.filters: dict[uuid.UUID, dict] = {}
        self.providers: set[uuid.UUID] = set()
        self.sublayers: dict[uuid.UUID, dict] = {}
        self.exempt: list[str] = []
        self._pending: list | None = None
        self._handed: dict[int, ctypes.Structure] = {}
        self._heap: dict[int, ctypes.Array] = {}
        self.set_calls = 0
        self.fail_filter_at: int | None = None

    # the engine and its transactions
    def FwpmEngineOpen0(self, server, authn, identity, session, ref):  # noqa: N802 -- Win32's
        assert authn == fenceapi.RPC_C_AUTHN_WINNT and session._obj.flags == 0  # not dynamic
        out(ref, 0x77)
        return 0

    def FwpmEngineClose0(self, engine):  # noqa: N802
        return 0

    def FwpmTransactionBegin0(self, engine, flags):  # noqa: N802
        assert self._pending is None, "a transaction inside a transaction"
        self._pending = []
        return 0

    def FwpmTransactionCommit0(self, engine):  # noqa: N802
        for apply in self._pending or ():
            apply()
        self._pending = None
        return 0

    def FwpmTransactionAbort0(self, engine):  # noqa: N802
        self._pending = None
        return 0

    def _in_transaction(self, apply) -> None:
        if self._pending is None:
            apply()
        else:
            self._pending.append(apply)

    def FwpmProviderAdd0(self, engine, provider, sd):  # noqa: N802
        key = uuid.UUID(bytes_le=bytes(provider._obj.providerKey))
        if key in self.providers:
            return fenceapi.FWP_E_ALREADY_EXISTS
        self._in_transaction(lambda: self.providers.add(key))
        return 0

    def FwpmSubLayerAdd0(self, engine, sublayer, sd):  # noqa: N802
        made = sublayer._obj
        key = uuid.UUID(bytes_le=bytes(made.subLayerKey))
        if key in self.sublayers:
            return fenceapi.FWP_E_ALREADY_EXISTS
        entry = {"weight": made.weight,
                 "provider": uuid.UUID(bytes_le=bytes(GUID.from_address(made.providerKey)))}
        self._in_transaction(lambda: self.sublayers.__setitem__(key, entry))
        return 0

    def FwpmSubLayerDeleteByKey0(self, engine, key):  # noqa: N802
        wanted = uuid.UUID(bytes_le=bytes(key._obj))
        if wanted not in self.sublayers:
            return fenceapi.FWP_E_SUBLAYER_NOT_FOUND
        if any(f["sublayer"] == wanted for f in self.filters.values()):
            return fenceapi.FWP_E_IN_USE
        del self.sublayers[wanted]
        return 0

    def FwpmProviderDeleteByKey0(self, engine, key):  # noqa: N802
        wanted = uuid.UUID(bytes_le=bytes(key._obj))
        if wanted not in self.providers:
            return fenceapi.FWP_E_PROVIDER_NOT_FOUND
        self.providers.discard(wanted)
        return 0

    # filters
    def FwpmFilterAdd0(self, engine, made, sd, filter_id):  # noqa: N802
        assert self._pending is not None, "filters are added in a transaction"
        # (bound with a status check, as fenceapi binds it: a failure is an OSError)
        if self.fail_filter_at is not None and len(self._pending) == self.fail_filter_at:
            raise win32_error(fenceapi.FWP_E_ALREADY_EXISTS, "FwpmFilterAdd0")
        seen = read_filter(made._obj)
        if seen["sublayer"] not in self.sublayers:
            raise win32_error(fenceapi.FWP_E_SUBLAYER_NOT_FOUND, "FwpmFilterAdd0")
        self._pending.append(lambda: self.filters.__setitem__(seen["key"], seen))
        return 0

    def FwpmFilterGetByKey0(self, engine, key, ref):  # noqa: N802
        wanted = uuid.UUID(bytes_le=bytes(key._obj))
        seen = self.filters.get(wanted)
        if seen is None:
            return fenceapi.FWP_E_FILTER_NOT_FOUND
        copy = FWPM_FILTER0()
        copy.filterKey = GUID.from_buffer_copy(wanted.bytes_le)
        copy.subLayerKey = GUID.from_buffer_copy(seen["sublayer"].bytes_le)
        provider = GUID.from_buffer_copy(seen["provider"].bytes_le)
        copy.providerKey = ctypes.addressof(provider)
        self._handed[ctypes.addressof(copy)] = (copy, provider)
        ref._obj.contents = copy
        return 0

    def FwpmFreeMemory0(self, pointer):  # noqa: N802
        address = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p)).contents.value
        assert self._handed.pop(address, None) is not None, "freed what WFP did not hand out"

    def FwpmFilterDeleteByKey0(self, engine, key):  # noqa: N802
        wanted = uuid.UUID(bytes_le=bytes(key._obj))
        if self.filters.pop(wanted, None) is None:
            return fenceapi.FWP_E_FILTER_NOT_FOUND
        return 0

    # the loopback exemption list
    def GetProcessHeap(self):  # noqa: N802
        return 0x4EA9

    def NetworkIsolationGetAppContainerConfig(self, count, ref):  # noqa: N802
        out(count, len(self.exempt))
        if self.exempt:  # (else the pointer stays NULL)
            array = (SID_AND_ATTRIBUTES * len(self.exempt))()
            for slot, sid in zip(array, self.exempt, strict=True):
                slot.Sid = self._sid_buffer(sid)
                self._heap[slot.Sid] = self._allocated[slot.Sid]
            self._heap[ctypes.addressof(array)] = array
            ref._obj.contents = array[0]
        return 0

    def HeapFree(self, heap, flags, memory):  # noqa: N802
        address = getattr(memory, "value", memory)
        assert heap == 0x4EA9 and self._heap.pop(address, None) is not None, "a double free"
        self._allocated.pop(address, None)
        return 1

    def NetworkIsolationSetAppContainerConfig(self, count, array):  # noqa: N802
        self.set_calls += 1
        self.exempt = [sids.from_bytes(ctypes.string_at(array[i].Sid, 68))[0]
                       for i in range(count)]
        return 0

    def leaked(self) -> list[int]:
        """What the caller was handed and has not given back (heap memory, filters)."""
        return [*self._heap, *self._handed]


def read_filter(made: FWPM_FILTER0) -> dict:
    """An FWPM_FILTER0 as the engine reads it: keys, and each condition's value through its
    pointer."""
    conditions = []
    for slot in (FWPM_FILTER_CONDITION0 * made.numFilterConditions).from_address(
            made.filterCondition):
        kind, raw = slot.conditionValue.type, slot.conditionValue.uint64
        if kind == wfp.FWP_SID:
            value: object = sids.from_bytes(ctypes.string_at(raw, 68))[0]
        elif kind == wfp.FWP_V4_ADDR_MASK:
            pair = FWP_V4_ADDR_AND_MASK.from_address(raw)
            value = str(ipaddress.IPv4Network((pair.addr, bin(pair.mask).count("1"))))
        elif kind == wfp.FWP_V6_ADDR_MASK:
            pair = FWP_V6_ADDR_AND_MASK.from_address(raw)
            value = str(ipaddress.IPv6Network((bytes(pair.addr), pair.prefixLength)))
        else:
            value = raw
        conditions.append((uuid.UUID(bytes_le=bytes(slot.fieldKey)), slot.matchType, kind,
                           value))
    return {"key": uuid.UUID(bytes_le=bytes(made.filterKey)),
            "layer": uuid.UUID(bytes_le=bytes(made.layerKey)),
            "sublayer": uuid.UUID(bytes_le=bytes(made.subLayerKey)),
            "provider": uuid.UUID(bytes_le=bytes(GUID.from_address(made.providerKey))),
            "action": made.action.type, "flags": made.flags,
            "weight": (made.weight.type, made.weight.uint64), "conditions": conditions}


class SocketTransport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def read(self, size: int) -> bytes:
        return self.sock.recv(size)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()
