"""fence.Firewall over the Windows Filtering Platform and the loopback exemption list (Windows,
in the LocalSystem fence service).

**Filters.** The engine session is not dynamic (FWPM_SESSION0.flags 0): what the service adds
outlives it, so a crash of the service leaves the filters in force (never the exemption
without them) until the service's next reconcile takes them back from its ledger. Filters are
not persistent either (no FWPM_FILTER_FLAG_PERSISTENT): a reboot, which ends every sandbox,
ends them. A plan is added in one transaction, each filter with its recorded key, Stockade's
provider and sublayer (wfp.py), built by `filter_struct`. `delete_filter` reads the filter
first and refuses (RemovalError) to delete one whose provider or sublayer is not Stockade's:
a record can only ever take back the fence's own filters.

**The loopback exemption.** NetworkIsolationSetAppContainerConfig, the documented API behind
`CheckNetIsolation LoopbackExempt`: it replaces the whole list of AppContainers "allowed to send
loopback traffic", and its caller must first read the list
(NetworkIsolationGetAppContainerConfig) and keep what is there. So each change is a
read-modify-write under one lock of the service's, adding or removing exactly one package SID
and keeping every other entry (an administrator's own exemptions included). The list read is
freed as Microsoft's sample frees it (HeapFree of each SID and of the array). Chosen over
WFP permit filters of our own at the layer where Windows enforces loopback isolation, which
would have to out-rank Windows' own filters in an arbitration Microsoft does not document for
them; the exemption is the documented switch, and the fence's filters confine what it opens.
Not atomic against another program changing the list at the same moment: Microsoft's API
offers no such operation.

**Who runs.** `running(sid)` enumerates processes (K32EnumProcesses) and reads each one's
package SID from its token (fencepipe.process_facts); one it cannot open is passed over.
"""

from __future__ import annotations

import ctypes
import ipaddress
import threading
import uuid

from stockade.lifecycle.removers import RemovalError
from stockade.windows import fencepipe, identity, wfp
from stockade.windows import sid as sids
from stockade.windows.api import win32
from stockade.windows.fenceapi import (
    FWP_E_ALREADY_EXISTS,
    FWP_E_FILTER_NOT_FOUND,
    FWP_E_PROVIDER_NOT_FOUND,
    FWP_E_SUBLAYER_NOT_FOUND,
    RPC_C_AUTHN_WINNT,
    fence_win32,
)
from stockade.windows.fwpstructs import (
    DWORD,
    FWP_V4_ADDR_AND_MASK,
    FWP_V6_ADDR_AND_MASK,
    FWPM_FILTER0,
    FWPM_FILTER_CONDITION0,
    FWPM_PROVIDER0,
    FWPM_SESSION0,
    FWPM_SUBLAYER0,
    GUID,
)
from stockade.windows.structs import SID_AND_ATTRIBUTES

NAME = "Stockade egress fence"
_PIDS = 4096  # process ids read at once (more are asked for when the buffer fills)


def wfp_error(code: int, what: str) -> OSError:
    error = OSError(None, f"{what}: error 0x{code:08X}")
    error.winerror = code
    return error


def guid(value: uuid.UUID | str) -> GUID:
    """The GUID structure of `value` (its bytes as Windows lays a GUID out)."""
    return GUID.from_buffer_copy(uuid.UUID(str(value)).bytes_le)


def filter_struct(plan: wfp.Filter, key: str, keep: list) -> FWPM_FILTER0:
    """The FWPM_FILTER0 of `plan` with filter key `key`; everything it points to is appended to
    `keep`, which must outlive the structure's use."""
    conditions = (FWPM_FILTER_CONDITION0 * len(plan.conditions))()
    provider = guid(wfp.PROVIDER)
    name = ctypes.create_unicode_buffer(f"{NAME}: {plan.kind}")
    keep += [conditions, provider, name]
    for slot, condition in zip(conditions, plan.conditions, strict=True):
        slot.fieldKey = guid(wfp.FIELDS[condition.field])
        slot.matchType = wfp.MATCHES[condition.match]
        slot.conditionValue.type = wfp.value_type(condition)
        slot.conditionValue.uint64 = _value(condition, keep)
    made = FWPM_FILTER0()
    made.filterKey = guid(key)
    made.displayData.name = ctypes.cast(name, ctypes.c_wchar_p)
    made.flags = plan.flags
    made.providerKey = ctypes.addressof(provider)
    made.layerKey = guid(wfp.LAYERS[plan.layer])
    made.subLayerKey = guid(wfp.SUBLAYER)
    made.weight.type = wfp.FWP_UINT8
    made.weight.uint64 = plan.weight
    made.numFilterConditions = len(conditions)
    made.filterCondition = ctypes.addressof(conditions)
    made.action.type = plan.action
    return made


def _value(condition: wfp.Condition, keep: list) -> int:
    """What FWP_CONDITION_VALUE0's union holds for `condition`: the value itself (UINT8,
    UINT16, UINT32), or the address of what it points to (SID, address and mask)."""
    kind = wfp.value_type(condition)
    if kind == wfp.FWP_SID:
        held: ctypes.Array | ctypes.Structure = ctypes.create_string_buffer(
            sids.to_bytes(str(condition.value)))
    elif kind in (wfp.FWP_V4_ADDR_MASK, wfp.FWP_V6_ADDR_MASK):
        network = ipaddress.ip_network(condition.value)
        if network.version == 4:
            held = FWP_V4_ADDR_AND_MASK(int(network.network_address), int(network.netmask))
        else:
            held = FWP_V6_ADDR_AND_MASK()
            held.addr[:] = network.network_address.packed
            held.prefixLength = network.prefixlen
    elif condition.field == "IP_REMOTE_ADDRESS":  # one IPv4 address ("a.b.c.d" or "/32")
        return int(ipaddress.ip_network(condition.value).network_address)  # host order
    else:
        return int(condition.value)
    keep.append(held)
    return ctypes.addressof(held)


class WfpFirewall:
    """The host's WFP engine and loopback exemption list, for the fence service."""

    def __init__(self) -> None:
        session = FWPM_SESSION0()  # flags 0: not dynamic (see the module's docstring)
        name = ctypes.create_unicode_buffer(NAME)
        session.displayData.name = ctypes.cast(name, ctypes.c_wchar_p)
        engine = ctypes.c_void_p()
        fence_win32().FwpmEngineOpen0(None, RPC_C_AUTHN_WINNT, None, ctypes.byref(session),
                                      ctypes.byref(engine))
        self._engine = engine
        self._exemptions = threading.Lock()
        self._transaction = threading.Lock()

    def close(self) -> None:
        fence_win32().FwpmEngineClose0(self._engine)

    def ensure_sublayer(self) -> None:
        """Stockade's provider and sublayer, added unless they exist (not persistent: the
        service adds them again after a reboot)."""
        api = fence_win32()
        keep: list = []
        provider = FWPM_PROVIDER0(providerKey=guid(wfp.PROVIDER))
        provider.displayData.name = self._text(NAME, keep)
        sublayer = FWPM_SUBLAYER0(subLayerKey=guid(wfp.SUBLAYER), weight=wfp.SUBLAYER_WEIGHT)
        sublayer.displayData.name = self._text(NAME, keep)
        key = guid(wfp.PROVIDER)
        sublayer.providerKey = ctypes.addressof(key)
        with self._transaction:
            api.FwpmTransactionBegin0(self._engine, 0)
            try:
                for result in (api.FwpmProviderAdd0(self._engine, ctypes.byref(provider), None),
                               api.FwpmSubLayerAdd0(self._engine, ctypes.byref(sublayer),
                                                    None)):
                    if result not in (0, FWP_E_ALREADY_EXISTS):
                        raise wfp_error(result, "adding the provider or sublayer")
                api.FwpmTransactionCommit0(self._engine)
            except BaseException:
                api.FwpmTransactionAbort0(self._engine)
                raise

    def remove_sublayer(self) -> None:
        """Delete Stockade's sublayer and provider (uninstall); OSError (FWP_E_IN_USE) while
        a filter of the fence is still there."""
        with self._transaction:
            self._remove_sublayer()

    def _remove_sublayer(self) -> None:
        api = fence_win32()
        result = api.FwpmSubLayerDeleteByKey0(self._engine, ctypes.byref(guid(wfp.SUBLAYER)))
        if result not in (0, FWP_E_SUBLAYER_NOT_FOUND):
            raise wfp_error(result, "FwpmSubLayerDeleteByKey0")
        result = api.FwpmProviderDeleteByKey0(self._engine, ctypes.byref(guid(wfp.PROVIDER)))
        if result not in (0, FWP_E_PROVIDER_NOT_FOUND):
            raise wfp_error(result, "FwpmProviderDeleteByKey0")

    @staticmethod
    def _text(text: str, keep: list) -> ctypes.c_wchar_p:
        buffer = ctypes.create_unicode_buffer(text)
        keep.append(buffer)
        return ctypes.cast(buffer, ctypes.c_wchar_p)

    def add_filters(self, plan: tuple[wfp.Filter, ...], keys: tuple[str, ...]) -> None:
        api = fence_win32()
        keep: list = []
        made = [filter_struct(one, key, keep) for one, key in zip(plan, keys, strict=True)]
        with self._transaction:
            api.FwpmTransactionBegin0(self._engine, 0)
            try:
                for one in made:
                    api.FwpmFilterAdd0(self._engine, ctypes.byref(one), None, None)
                api.FwpmTransactionCommit0(self._engine)
            except BaseException:
                api.FwpmTransactionAbort0(self._engine)
                raise

    def delete_filter(self, key: str) -> None:
        # (under the transaction lock: a call on the session while another thread's explicit
        # transaction is open would become part of it)
        with self._transaction:
            self._delete_filter(key)

    def _delete_filter(self, key: str) -> None:
        api = fence_win32()
        wanted = guid(key)
        found = ctypes.POINTER(FWPM_FILTER0)()
        result = api.FwpmFilterGetByKey0(self._engine, ctypes.byref(wanted), ctypes.byref(found))
        if result == FWP_E_FILTER_NOT_FOUND:
            return
        if result:
            raise wfp_error(result, "FwpmFilterGetByKey0")
        try:
            seen = found.contents
            ours = bool(seen.providerKey) and bytes(GUID.from_address(seen.providerKey)) == \
                bytes(guid(wfp.PROVIDER)) and bytes(seen.subLayerKey) == bytes(guid(wfp.SUBLAYER))
        finally:
            api.FwpmFreeMemory0(ctypes.cast(ctypes.byref(found), ctypes.POINTER(ctypes.c_void_p)))
        if not ours:
            raise RemovalError(f"filter {key} is not one of Stockade's fence: kept")
        result = api.FwpmFilterDeleteByKey0(self._engine, ctypes.byref(wanted))
        if result not in (0, FWP_E_FILTER_NOT_FOUND):
            raise wfp_error(result, "FwpmFilterDeleteByKey0")

    def exemptions(self) -> list[str]:
        """The package SIDs exempt from loopback isolation now."""
        api = fence_win32()
        count = DWORD()
        array = ctypes.POINTER(SID_AND_ATTRIBUTES)()
        api.NetworkIsolationGetAppContainerConfig(ctypes.byref(count), ctypes.byref(array))
        heap = api.GetProcessHeap()
        try:
            return [identity.sid_string(array[i].Sid) for i in range(count.value)]
        finally:
            for i in range(count.value):
                api.HeapFree(heap, 0, array[i].Sid)
            if array:
                api.HeapFree(heap, 0, ctypes.cast(array, ctypes.c_void_p))

    def _set_exemptions(self, listed: list[str]) -> None:
        buffers = [ctypes.create_string_buffer(sids.to_bytes(one)) for one in listed]
        array = (SID_AND_ATTRIBUTES * len(buffers))(
            *(SID_AND_ATTRIBUTES(ctypes.addressof(buffer), 0) for buffer in buffers))
        fence_win32().NetworkIsolationSetAppContainerConfig(len(buffers), array)

    def exempt(self, sid: str) -> None:
        with self._exemptions:
            listed = self.exemptions()
            if sid.upper() not in (one.upper() for one in listed):
                self._set_exemptions([*listed, sid])

    def unexempt(self, sid: str) -> None:
        with self._exemptions:
            listed = self.exemptions()
            kept = [one for one in listed if one.upper() != sid.upper()]
            if len(kept) != len(listed):
                self._set_exemptions(kept)

    def running(self, sid: str) -> bool:
        return bool(self.holders(sid))

    def holders(self, sid: str) -> set[str]:
        """The user SIDs of every process of package SID `sid` (a snapshot)."""
        api = fence_win32()
        size = _PIDS
        while True:
            pids = (DWORD * size)()
            returned = DWORD()
            api.K32EnumProcesses(pids, ctypes.sizeof(pids), ctypes.byref(returned))
            if returned.value < ctypes.sizeof(pids):
                break
            size *= 2
        users = set()
        for pid in pids[:returned.value // ctypes.sizeof(DWORD)]:
            try:
                facts = fencepipe.process_facts(pid)
            except OSError:
                continue  # (gone, or protected: no AppContainer of ours)
            if facts.package.upper() == sid.upper():
                users.add(facts.user)
        return users


def windows_firewall() -> WfpFirewall:
    """The service's firewall, its sublayer in place."""
    win32()  # (UnavailableError off Windows)
    firewall = WfpFirewall()
    firewall.ensure_sublayer()
    return firewall
