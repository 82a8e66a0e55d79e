"""Classify a resolved address: may the proxy dial it on the sandbox's behalf?

Only globally reachable unicast addresses pass. Refused: loopback, unspecified, link-local,
multicast, private (RFC 1918, CGNAT 100.64/10, ULA fc00::/7, site-local), cloud metadata
endpoints, reserved/documentation/benchmark ranges, IPv6 outside global unicast 2000::/3, and
the host's own addresses. IPv6 forms that carry an IPv4 address (IPv4-mapped, IPv4-compatible,
NAT64 64:ff9b::/96, 6to4 2002::/16) are judged by the address they carry, so `::ffff:127.0.0.1`
is loopback. The caller exempts addresses the policy lists literally.

The tables are explicit rather than `ipaddress.is_global`, whose answers changed across Python
patch releases.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",   # AWS, GCP, Azure, OpenStack, ...
    "fd00:ec2::254",     # AWS IPv6
    "100.100.100.200",   # Alibaba Cloud
    "168.63.129.16",     # Azure wire server (a public-looking address)
))

_V4 = [(ipaddress.IPv4Network(net), kind) for net, kind in (
    ("0.0.0.0/32", "unspecified"),
    ("0.0.0.0/8", "reserved"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link_local"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "private"),          # CGNAT shared address space
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),           # includes broadcast 255.255.255.255
    ("192.0.0.0/24", "reserved"),          # IETF protocol assignments
    ("192.0.2.0/24", "reserved"),          # documentation
    ("198.51.100.0/24", "reserved"),       # documentation
    ("203.0.113.0/24", "reserved"),        # documentation
    ("192.88.99.0/24", "reserved"),        # former 6to4 relay anycast
    ("198.18.0.0/15", "reserved"),         # benchmarking
)]

_V6 = [(ipaddress.IPv6Network(net), kind) for net, kind in (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link_local"),
    ("fc00::/7", "private"),
    ("fec0::/10", "private"),              # deprecated site-local
    ("ff00::/8", "multicast"),
    ("2001::/23", "reserved"),             # IETF protocol assignments, incl. Teredo
    ("2001:db8::/32", "reserved"),         # documentation
    ("3fff::/20", "reserved"),             # documentation
)]
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


class Forbidden(NamedTuple):
    """Why an address is refused: `kind` (e.g. "loopback"), and `via`, the IPv6 form that
    carried the IPv4 address judged ("" if none)."""

    kind: str
    via: str = ""

    def describe(self) -> str:
        text = _DESCRIPTIONS[self.kind]
        return f"{text} (inside a {self.via} IPv6 address)" if self.via else text


_DESCRIPTIONS = {
    "unspecified": "the unspecified address",
    "loopback": "a loopback address",
    "link_local": "a link-local address",
    "private": "a private address",
    "multicast": "a multicast address",
    "metadata": "a cloud metadata address",
    "reserved": "a reserved, non-global address",
    "host_address": "one of this host's own addresses",
}


# Documentation ranges: the proxy refuses them (no real service lives there), but the
# destination guard of network "any" lets them through, so a test can build its own small
# internet on them without lifting the guard.
DOCUMENTATION = frozenset(ipaddress.ip_network(net) for net in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20"))


def guarded_networks() -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]]:
    """What the destination guard of network "any" keeps the sandbox from: every range the
    proxy refuses but the documentation ranges, the metadata endpoints, and the IPv6 forms
    that carry a guarded IPv4 address. As the proxy does, it refuses all of IPv6 outside
    global unicast 2000::/3 (IPv4-mapped and -compatible forms, a translator's local-use
    NAT64 prefix 64:ff9b:1::/48 or IPv4-translated ::ffff:0:0:0/96, which may carry a
    private address in a layout no table can read) but NAT64's well-known prefix, where
    each guarded IPv4 range is refused, as it is in 6to4: NAT64 to a public address works."""
    v4 = [(net, kind) for net, kind in _V4 if net not in DOCUMENTATION]
    v4 += [(ipaddress.ip_network(a), "metadata") for a in METADATA if a.version == 4]
    v6: list[tuple[ipaddress.IPv6Network, str]] = [
        (net, kind) for net, kind in _V6 if net not in DOCUMENTATION]
    v6 += [(ipaddress.ip_network(a), "metadata") for a in METADATA if a.version == 6]
    v6 += [(net, "reserved") for net in _outside_global_unicast()]
    for net, kind in v4:
        v6 += [(form, kind) for form in carried_forms(net)]
    return [*v4, *v6]


def carried_forms(net: ipaddress.IPv4Network) -> list[ipaddress.IPv6Network]:
    """The IPv6 ranges that carry the addresses of `net` to a translator: NAT64's well-known
    prefix and 6to4 (the guard refuses them with the range itself, and with each of the host's
    own addresses, which a translator on the way would otherwise lead back to)."""
    inner = int(net.network_address)
    return [ipaddress.IPv6Network((int(_NAT64.network_address) | inner, 96 + net.prefixlen)),
            ipaddress.IPv6Network(((0x2002 << 112) | (inner << 80), 16 + net.prefixlen))]


def _outside_global_unicast() -> list[ipaddress.IPv6Network]:
    """IPv6 outside 2000::/3, NAT64's well-known prefix excepted."""
    outside = list(ipaddress.IPv6Network("::/0").address_exclude(_GLOBAL_UNICAST))
    low = ipaddress.IPv6Network("::/3")
    return [net for net in outside if net != low] + list(low.address_exclude(_NAT64))


def unmap(address: IPAddress) -> IPAddress:
    """`::ffff:a.b.c.d` is the IPv4 address a.b.c.d on the wire; everything else is itself."""
    if address.version == 6 and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def classify(address: IPAddress) -> Forbidden | None:
    """Why the proxy must not dial `address`, or None if it is a public unicast address."""
    if address.version == 6 and address.scope_id:
        address = ipaddress.IPv6Address(address.compressed.partition("%")[0])
    address = unmap(address)
    if address.version == 6:
        embedded = _embedded(address)
        if embedded:
            via, ipv4 = embedded
            inner = _classify_v4(ipv4)
            if inner:
                return Forbidden(inner.kind, via)
            if via == "IPv4-compatible":
                return Forbidden("reserved")
    forbidden = _classify_v4(address) if address.version == 4 else _classify_v6(address)
    if forbidden is None and is_host_address(address):
        return Forbidden("host_address")
    return forbidden


def _classify_v4(address: ipaddress.IPv4Address) -> Forbidden | None:
    if address in METADATA:
        return Forbidden("metadata")
    return next((Forbidden(kind) for net, kind in _V4 if address in net), None)


def _classify_v6(address: ipaddress.IPv6Address) -> Forbidden | None:
    if address in METADATA:
        return Forbidden("metadata")
    for net, kind in _V6:
        if address in net:
            return Forbidden(kind)
    if address in _NAT64 or address in _GLOBAL_UNICAST:
        return None
    return Forbidden("reserved")


def _embedded(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64:
        return "NAT64", low32
    if address.sixtofour:
        return "6to4", address.sixtofour
    if address in _COMPATIBLE and int(address) > 1:
        return "IPv4-compatible", low32
    return None


def is_host_address(address: IPAddress) -> bool:
    """Whether `address` belongs to this host, asked of the kernel by binding a UDP socket to it.

    Binding succeeds exactly for local addresses (including AnyIP routes and addresses added
    after start-up), on every OS, with no interface parsing. An unexpected bind error counts as
    local (refuse); a host without the address family has no such address.
    """
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        probe = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return False
    with probe:
        try:
            probe.bind((str(address), 0))
        except OSError as exc:
            return exc.errno != errno.EADDRNOTAVAIL
    return True
