"""Destinations a `network.mode = "any"` sandbox may reach past the destination guard, as named
by `network.reach`.

Accepted, and normalised (network address, compressed IPv6, port without leading zeros):

- `10.0.0.5`, `192.168.1.0/24`, `fd00::/8`: that address or range, every port;
- `10.0.0.5:5432`, `192.168.1.0/24:443`, `[fd00::1]:8080`: only that TCP/UDP port
  (IPv6 in brackets when a port follows).

Names are refused: the guard decides by address, before any name is resolved (an allowlist of
names is `network.mode = "allowlist"`). So is loopback, which reach could never open: the
sandbox's own is always open, the host's never reachable (pasta maps none of its ports).
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from stockade.policy.render import show

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_LOOPBACK = tuple(ipaddress.ip_network(net) for net in ("127.0.0.0/8", "::1/128",
                                                        "::ffff:127.0.0.0/104"))
_MAX_PORT = 65535


class Reach(NamedTuple):
    """One parsed entry: a network and a port (None: every port)."""

    network: IPNetwork
    port: int | None


def normalise_reach(value: object) -> str:
    """The normalised form of a `network.reach` entry; ValueError naming the problem."""
    return render(parse_reach(value))


def parse_reach(value: object) -> Reach:
    example = 'an address or range such as "10.0.0.5", "192.168.1.0/24:443" or "[fd00::1]:80"'
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected {example}, got {show(value)}")
    text, port = value, None
    if text.startswith("["):
        text, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f'expected "[IPv6]" or "[IPv6]:port", got {show(value)}')
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        text, _, port_text = text.partition(":")
    else:
        port_text = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= _MAX_PORT:
            raise ValueError(f"expected a port from 1 to {_MAX_PORT}, got {show(value)}")
        port = int(port_text)
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"expected {example} (the guard decides by address, not by name: "
                         f'names are for network.mode = "allowlist"), got {show(value)}'
                         ) from None
    if any(network.version == loop.version and network.subnet_of(loop) for loop in _LOOPBACK):
        raise ValueError(f"{show(value)} is loopback: in the sandbox that is its own (always "
                         "reachable), and the host's loopback is never reachable from mode any "
                         "(pasta maps none of its ports); a host service is reached through "
                         'the proxy: network.mode = "allowlist" with allow = ["127.0.0.1:PORT"]')
    return Reach(network, port)


def render(entry: Reach) -> str:
    network, port = entry
    single = network.prefixlen == network.max_prefixlen
    text = str(network.network_address) if single else str(network)
    if port is None:
        return text
    return f"[{text}]:{port}" if network.version == 6 else f"{text}:{port}"
