"""The fence service's client: whether the service is there (`helper_refusal`, which the
backend's `check` asks for `network.mode` "allowlist" and "any"), and one launch's fence
(`FenceClient.fence`, then `release`). The transport is the service's named pipe
(fencepipe.connect on Windows, which refuses a pipe that is not LocalSystem's: a squatter on
its name could otherwise answer "fenced" for filters it never added); tests give their
own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from stockade.errors import SetupError
from stockade.windows import fenceproto

INSTALL = "install it, as an administrator: `stockade fence install` (docs/windows.md)"


class Transport(Protocol):
    def read(self, size: int) -> bytes:
        """At most `size` bytes; b"" once the service closed the connection."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def _pipe() -> Transport:
    from stockade.windows import fencepipe  # (Windows only)

    return fencepipe.connect()


class FenceClient:
    """One connection to the service; `connect()` opens the transport (default: the pipe)."""

    def __init__(self, connect: Callable[[], Transport] | None = None) -> None:
        self._transport = (connect or _pipe)()

    def ask(self, body: dict) -> dict:
        try:
            self._transport.write(fenceproto.encode(body))
            return fenceproto.answer(fenceproto.read_frame(self._transport.read))
        except fenceproto.ProtocolError as exc:
            raise SetupError(exc.code, f"the fence service's answer: {exc.message}",
                             stage="network") from None
        except OSError as exc:
            raise SetupError("fence_lost", "the connection to the fence service broke "
                             f"({exc.strerror or exc.__class__.__name__})",
                             stage="network") from None

    def status(self) -> dict:
        return self.ask({"v": fenceproto.VERSION, "op": "status"})

    def fence(self, mode: str, profile: str, pid: int, port: int | None) -> dict:
        body = {"v": fenceproto.VERSION, "op": "fence", "mode": mode, "profile": profile,
                "pid": pid}
        if mode == "allowlist":
            body["proxy_port"] = port
        return self.ask(body)

    def release(self) -> None:
        self.ask({"v": fenceproto.VERSION, "op": "release"})

    def close(self) -> None:
        self._transport.close()


def helper_refusal(connect: Callable[[], Transport] | None = None) -> str | None:
    """Why the fence service cannot fence a launch here, naming how to install it; None when
    it answers."""
    try:
        client = FenceClient(connect)
    except (OSError, SetupError) as exc:
        why = exc.message if isinstance(exc, SetupError) else (
            exc.strerror or exc.__class__.__name__)
        return f"Stockade's egress fence service is not running here ({why}); {INSTALL}"
    try:
        client.status()
    except (OSError, SetupError) as exc:
        why = exc.message if isinstance(exc, SetupError) else (
            exc.strerror or exc.__class__.__name__)
        return f"Stockade's egress fence service did not answer as expected ({why}); {INSTALL}"
    finally:
        client.close()
    return None
