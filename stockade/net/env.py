"""The environment a sandboxed child gets so that ordinary clients use the proxy.

The proxy is reached inside the sandbox at 127.0.0.1:SANDBOX_PORT (the sandbox's own loopback;
how the backend connects that to the proxy is its business).
`NO_PROXY` is set, empty, on purpose: it overrides whatever the host had (which could name
internal hosts) and lists no loopback name, so a client sends even `localhost` requests to the
proxy, which refuses them unless the address is allowed literally, instead of silently going
direct. The cost: a client talking to a server the child itself runs on loopback must be told
to bypass the proxy explicitly.

`GIT_SSH_COMMAND` sends `git` over SSH through SOCKS5 with OpenBSD `nc` (`-X 5 -x`); it only
works where `ssh` and that `nc` exist, and the SSH host must be allowed with its port
(`github.com:22`).

Windows holds one variable per name whatever its case (`HTTP_PROXY` is `http_proxy`), and its
environment block refuses two names differing only in case: there each variable is set once,
upper case, and replaces any of its name in another case.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from stockade.errors import UsageError

SANDBOX_PORT = 3128  # where the proxy answers inside a sandbox (its own loopback, so fixed)
CASE_INSENSITIVE = sys.platform == "win32"  # (a native sandbox's environment is the host's kind)


def proxy_environment(port: int, host: str = "127.0.0.1", *,
                      case_insensitive: bool | None = None) -> dict[str, str]:
    """Proxy variables for a proxy at `host`:`port` (an IPv4 address: the sandbox's loopback,
    or where a VM guest finds the proxy): upper and lower case, or upper case only for a
    case-insensitive (Windows) environment (default: this host's kind)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise UsageError(f"proxy port must be 1-65535, got {port!r}")
    http_url = f"http://{host}:{port}"
    names = {"HTTP_PROXY": http_url, "HTTPS_PROXY": http_url,
             "ALL_PROXY": f"socks5h://{host}:{port}", "NO_PROXY": ""}
    if case_insensitive is None:
        case_insensitive = CASE_INSENSITIVE
    env = dict(names) if case_insensitive else names | {
        name.lower(): value for name, value in names.items()}
    env["GIT_SSH_COMMAND"] = f"ssh -o ProxyCommand='nc -X 5 -x {host}:{port} %h %p'"
    return env


def with_proxy(env: Mapping[str, str], proxy: Mapping[str, str], *,
               case_insensitive: bool | None = None) -> dict[str, str]:
    """`env` with the `proxy` variables over it; in a case-insensitive environment they also
    replace a variable of their name in any other case (else Windows would see both)."""
    if case_insensitive is None:
        case_insensitive = CASE_INSENSITIVE
    if case_insensitive:
        taken = {name.upper() for name in proxy}
        env = {name: value for name, value in env.items() if name.upper() not in taken}
    return dict(env) | dict(proxy)
