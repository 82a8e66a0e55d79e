"""Every StockadeError crosses a process whole (attack K9: a Ray task's error is pickled in
its worker and unpickled in the driver; one whose __init__ takes other arguments than its
`args` holds failed to unpickle, and the driver got Ray's UnserializableException instead):
its type, code, message and attributes survive a pickle round trip."""

from __future__ import annotations

import importlib
import pickle
import pkgutil
from collections.abc import Iterator

import stockade
from stockade.errors import (
    BrokerError,
    ChangesError,
    PolicyError,
    RequestError,
    SetupError,
    StartError,
    StockadeError,
    UnenforceableError,
    UsageError,
)
from stockade.integrations.workspace import FileError

# Those whose constructor is not (code, message), with their attributes set
MADE = {PolicyError: lambda: PolicyError("bad value", file="p.toml", key="limits.pids",
                                         code="policy_type"),
        RequestError: lambda: RequestError("too large"),
        UsageError: lambda: UsageError("--port: not a port"),
        UnenforceableError: lambda: UnenforceableError("network.allowlist", "no proxy"),
        SetupError: lambda: SetupError("mount_failed", "no /proc", stage="mounts"),
        BrokerError: lambda: BrokerError("broker_refused", "a manifest"),
        ChangesError: lambda: ChangesError("changes_conflict", "a\nb", ("a", "b")),
        FileError: lambda: FileError("permission_denied", "x: read-only", grant="roots")}


def subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def test_every_stockade_error_survives_a_pickle_round_trip():
    for module in pkgutil.walk_packages(stockade.__path__, "stockade."):
        try:
            importlib.import_module(module.name)
        except ImportError:
            pass  # (an integration whose framework is not installed here)
    classes = {StockadeError, *subclasses(StockadeError)}
    assert {"SessionError", "ProtocolError", "UnavailableError", "CommandNotFound"} <= {
        cls.__name__ for cls in classes}
    for cls in classes:
        error = MADE[cls]() if cls in MADE else cls("some_code", "a message")
        if cls is StartError:
            assert type(StartError("command_not_found", "no sh")).__name__ == "CommandNotFound"
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls, cls
        assert (str(back), back.args, back.code, back.message) == (
            str(error), error.args, error.code, error.message), cls
        assert vars(back) == vars(error), cls
        if isinstance(error, OSError):
            assert (back.errno, back.strerror) == (error.errno, error.strerror)
