"""The Linux backend's entry in the registry (stockade/launch/registry.py)."""

from __future__ import annotations

from stockade.launch.backend import Backend
from stockade.launch.registry import NATIVE, Entry, register


def _backend() -> type[Backend]:
    from stockade.linux.backend import LinuxBackend

    return LinuxBackend


def _prepare() -> None:
    from stockade.linux import zygote

    zygote.fork_directly().prepare()


register(Entry("linux", NATIVE, ("linux",), _backend, prepare=_prepare))
