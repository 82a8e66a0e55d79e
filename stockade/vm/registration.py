"""The VM drivers' entries in the registry (stockade/launch/registry.py): containment "vm" is a
QEMU guest on Linux (qemu.py), a Windows Sandbox guest on Windows (wsb.py), whose ledger kind
(wsb_ledger.py) a reconcile there registers first."""

from __future__ import annotations

from stockade.launch.backend import Backend
from stockade.launch.registry import VM, Entry, register


def _qemu() -> type[Backend]:
    from stockade.vm.qemu import QemuBackend

    return QemuBackend


def _windows_sandbox() -> type[Backend]:
    from stockade.vm.wsb import WindowsSandboxBackend

    return WindowsSandboxBackend


def _windows_sandbox_kinds() -> None:
    from stockade.vm import wsb_ledger

    wsb_ledger.register_kinds()


register(Entry("qemu-vm", VM, ("linux",), _qemu))
register(Entry("windows-sandbox", VM, ("win32",), _windows_sandbox,
               record_kinds=_windows_sandbox_kinds))
