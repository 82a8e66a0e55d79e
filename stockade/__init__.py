"""Stockade: run untrusted commands under one policy, enforced with the strongest native
primitives of the host, failing closed.

    >>> import stockade
    >>> result = stockade.run(["echo", "hello"], preset="read-only")
    >>> result.returncode, result.stdout
    (0, b'hello\\n')
    >>> stockade.run(["sh", "-c", "exit 3"], check=True)
    Traceback (most recent call last):
    stockade.launch.result.CommandFailed: Command '['sh', '-c', 'exit 3']' returned non-zero ...
"""

from __future__ import annotations

import os as _os

TYPE_CHECKING = False  # (not imported from typing: `stockade run` starts faster without it)

try:
    # (the working directory when Stockade was first imported, before the program could move:
    # what "" and `-m` put first on its import path; launch/hostcode.py)
    _started_in: str | None = _os.getcwd()
except OSError:
    _started_in = None

__version__ = "0.1.0"

# Public names and the module defining each. Loaded on first use, so that the sandbox's own
# launcher, which imports a few `stockade.linux` modules, does not pay for the whole API.
_EXPORTS = {
    "run": "stockade.api", "arun": "stockade.api", "probe": "stockade.launch.probe",
    "PIPE": "stockade.api", "DEVNULL": "stockade.api", "STDOUT": "stockade.api",
    "CommandFailed": "stockade.launch.result", "CommandTimedOut": "stockade.launch.result",
    "Attestation": "stockade.launch.probe", "CommandNotFound": "stockade.errors",
    "PolicyError": "stockade.errors", "SetupError": "stockade.errors",
    "StartError": "stockade.errors", "StockadeError": "stockade.errors",
    "UnavailableError": "stockade.errors", "UnenforceableError": "stockade.errors",
    "UsageError": "stockade.errors",
    "Result": "stockade.launch.result", "Violation": "stockade.launch.result",
    "Policy": "stockade.policy", "load_policy": "stockade.policy", "preset": "stockade.policy",
    "Sandbox": "stockade.session.sandbox", "AsyncSandbox": "stockade.session.aio",
    "VmSandbox": "stockade.vm.qemu",
}
__all__ = [
    "DEVNULL", "PIPE", "STDOUT", "AsyncSandbox", "Attestation", "CommandFailed",
    "CommandNotFound", "CommandTimedOut", "Policy", "PolicyError", "Result", "Sandbox",
    "SetupError", "StartError", "StockadeError", "UnavailableError", "UnenforceableError",
    "UsageError", "Violation", "VmSandbox", "arun", "load_policy", "preset", "probe", "run",
]

if TYPE_CHECKING:
    from stockade.api import DEVNULL, PIPE, STDOUT, arun, run
    from stockade.errors import (
        CommandNotFound,
        PolicyError,
        SetupError,
        StartError,
        StockadeError,
        UnavailableError,
        UnenforceableError,
        UsageError,
    )
    from stockade.launch.probe import Attestation, probe
    from stockade.launch.result import CommandFailed, CommandTimedOut, Result, Violation
    from stockade.policy import Policy, load_policy, preset
    from stockade.session.aio import AsyncSandbox
    from stockade.session.sandbox import Sandbox
    from stockade.vm.qemu import VmSandbox


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stockade' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
