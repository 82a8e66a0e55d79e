"""The Windows backend's entry in the registry (stockade/launch/registry.py), with the ledger
kinds its launches write (records.py)."""

from __future__ import annotations

from stockade.launch.backend import Backend
from stockade.launch.registry import NATIVE, Entry, register


def _backend() -> type[Backend]:
    from stockade.windows.backend import WindowsBackend

    return WindowsBackend


def _record_kinds() -> None:
    from stockade.windows import records

    records.register_kinds()


register(Entry("windows", NATIVE, ("win32",), _backend, record_kinds=_record_kinds))
