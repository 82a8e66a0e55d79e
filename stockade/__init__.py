"""Stockade: run untrusted commands under one policy, enforced with the strongest native
primitives of the host, failing closed.

    >>> import stockade
    >>> result = stockade.run(["echo", "hello"], preset="read-only")
    >>> result.exit_code, result.stdout
    (0, b'hello\\n')
"""

from stockade.api import arun, run
from stockade.errors import (
    PolicyError,
    SetupError,
    StartError,
    StockadeError,
    UnavailableError,
    UnenforceableError,
    UsageError,
)
from stockade.launch.result import Result, Violation
from stockade.policy import Policy, load_policy, preset

__version__ = "0.1.0"

__all__ = [
    "Policy",
    "PolicyError",
    "Result",
    "SetupError",
    "StartError",
    "StockadeError",
    "UnavailableError",
    "UnenforceableError",
    "UsageError",
    "Violation",
    "arun",
    "load_policy",
    "preset",
    "run",
]
