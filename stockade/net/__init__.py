"""Network egress for `network.mode = "allowlist"`: a proxy deciding every destination.

Platform-neutral: the proxy listens on a unix socket and dials from the host; each backend
bridges that socket into its sandbox. TCP only (HTTP CONNECT, plain HTTP, SOCKS5 CONNECT);
there is no UDP.
"""

from stockade.net.env import proxy_environment
from stockade.net.proxy import Proxy, ProxyLimits
from stockade.net.rules import Ruleset

__all__ = ["Proxy", "ProxyLimits", "Ruleset", "proxy_environment"]
