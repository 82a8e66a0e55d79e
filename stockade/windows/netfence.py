"""A Windows launch's network beyond `none`, with the fence service (fence.py):

- `allowlist`: the AppContainer keeps no network capability; Stockade's proxy (the one
  stockade/net/proxy.py is on Linux: the same domain rules, address guard and denial log)
  listens on the host's 127.0.0.1 at a port of its own, which the child's proxy variables
  name; the fence service exempts the launch's AppContainer from loopback isolation and adds
  the filters that leave it TCP to that address and port alone (wfp.allowlist_plan);
- `any`: the AppContainer holds the `internetClient` capability (S-1-15-3-1), keeps loopback
  isolation, and the fence service adds the filters that keep it from the destination guard's
  ranges and the host itself (wfp.any_plan).

The fence is asked for once the child exists, suspended, and before it runs an instruction
(`LaunchNetwork.attach`), and given back at settlement, after the Job has drained (`close`).
Without the service both modes are refused (`check`), naming how to install it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from stockade.errors import SetupError, UnenforceableError
from stockade.launch.request import LaunchRequest
from stockade.net.env import proxy_environment, with_proxy
from stockade.windows import fenceclient, wfp

if TYPE_CHECKING:
    from stockade.net.proxy import Proxy

INTERNET_CLIENT = "S-1-15-3-1"  # SECURITY_CAPABILITY_INTERNET_CLIENT (winnt.h)


def check(request: LaunchRequest, fence: Callable[[], str | None] | None) -> None:
    """Refuse what the Windows backend cannot enforce of `request.network`; `fence()` says why
    the fence service cannot be used here (None: it can; no `fence` at all: it cannot)."""
    network = request.network
    if network.mode not in ("allowlist", "any"):
        return
    if network.credentials:
        raise UnenforceableError("network.credentials", "the Windows backend does not inject "
                                 "credentials: its proxy does not read requests (no CA of the "
                                 "launch's own is trusted inside the AppContainer); drop "
                                 "network.credentials")
    if network.http:
        raise UnenforceableError("network.http", "the Windows backend does not judge HTTP "
                                 "requests: its proxy does not read them; drop network.http")
    if network.reach:
        raise UnenforceableError("network.reach", "the Windows fence keeps every range of the "
                                 "destination guard from the AppContainer and lets none "
                                 "through; drop network.reach")
    why = fence() if fence is not None else (
        f"Stockade's egress fence service runs on Windows only; {fenceclient.INSTALL}")
    if why:
        raise UnenforceableError(f"network.{network.mode}", why)


def capabilities(request: LaunchRequest) -> tuple[str, ...]:
    """The network capabilities `request`'s AppContainer holds: `internetClient` for `any`
    alone (an `allowlist` child reaches the host's proxy through the loopback exemption). The
    host verifies the child's token against these, and the broker grants them (broker.py)."""
    return (INTERNET_CLIENT,) if request.network.mode == "any" else ()


class LaunchNetwork:
    """One launch's network: `capabilities` for the AppContainer, `environment` for the child,
    `attach` once the child is created, `close` at settlement (after the Job drained)."""

    def __init__(self, request: LaunchRequest,
                 connect: Callable[[], fenceclient.Transport] | None = None) -> None:
        self.mode = request.network.mode
        self.capabilities = capabilities(request)
        self.port: int | None = None
        self._connect = connect
        self._client: fenceclient.FenceClient | None = None
        self._proxy: Proxy | None = None
        if self.mode == "allowlist":
            from stockade.net.proxy import Proxy  # only allowlist launches pay for it

            listener = socket.create_server((wfp.LOOPBACK, 0))
            self.port = listener.getsockname()[1]
            self._proxy = Proxy(request.network.allow, request.network.deny, request.request_id)
            self._proxy.start(listener=listener)

    def __enter__(self) -> LaunchNetwork:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def environment(self, env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """`env` with the proxy variables naming this launch's proxy (compile sets them for
        the port a Linux sandbox has on its own loopback)."""
        if self.port is None:
            return env
        proxy = proxy_environment(self.port, wfp.LOOPBACK, case_insensitive=True)
        return tuple(sorted(with_proxy(dict(env), proxy, case_insensitive=True).items()))

    def attach(self, profile: str, pid: int) -> dict:
        """Fence the child `pid` (suspended, in the AppContainer of `profile`); what the
        service applied, as facts for `Handle.enforced`. SetupError if it refuses."""
        if self.mode not in ("allowlist", "any"):
            return {}
        self._client = fenceclient.FenceClient(self._connect)
        done = self._client.fence(self.mode, profile, pid, self.port)
        return {"fence": self.mode, "filters": done.get("filters"),
                "loopback_exemption": done.get("exemption")}

    def denials(self) -> list[dict]:
        return self._proxy.denials() if self._proxy is not None else []

    def close(self) -> None:
        """Give the fence back and stop the proxy. A fence the service must keep a while (a
        process of the AppContainer still runs) or cannot be told about (the pipe broke) is
        the service's to take back: it does when the connection closes or at its reconcile."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.release()
            except (OSError, SetupError):
                pass
            finally:
                client.close()
        if self._proxy is not None:
            self._proxy.stop()
