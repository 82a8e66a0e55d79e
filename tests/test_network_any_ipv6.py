"""network.mode = "any" in IPv6: the destination guard holds for every IPv6 form of a guarded
destination, as it does in IPv4 (tests/test_network_any.py), in the same small internet of the
test's own (tests/networld.py: the host has IPv6 and a default route, so pasta gives the sandbox
IPv6 too), root and rootless.

Each refused destination is served in the world (or on the host), and its server's record shows
that nothing arrived; the open ones answer, so a refusal is the guard's and not a missing route.
"""

from __future__ import annotations

import ipaddress

import pytest
from networld import (
    COMPATIBLE_PRIVATE,
    GLOBAL6,
    GROUP6,
    HOST6,
    HOST_LO6,
    LOCAL_NAT64_PRIVATE,
    METADATA6,
    NAT64_PRIVATE,
    NAT64_PUBLIC,
    PUBLIC6,
    ROUTER6,
    ROUTER_LINK6,
    SITE6,
    SIX_TO_FOUR_PRIVATE,
    SIX_TO_FOUR_PUBLIC,
    TRANSLATED_PRIVATE,
    ULA6,
)
from test_network_any import PRIVATE, in_world, reached

from stockade.net import addresses

pytestmark = pytest.mark.usefixtures("linux")

LINK = "wan"  # the sandbox's interface: pasta names it after the host's (networld.py's veth)

# (the target, the address its server records when it is reached, the denial's reason code)
GUARDED6 = [
    (f"tcp:[{ULA6}]:80", f"internet:{ULA6}:tcp", "address_private"),
    (f"udp:[{ULA6}]:7", f"internet:{ULA6}:udp", "address_private"),
    (f"tcp:[{METADATA6}]:80", f"internet:{METADATA6}:tcp", "address_metadata"),
    (f"tcp:[{SITE6}]:80", f"internet:{SITE6}:tcp", "address_private"),
    (f"tcp:[{NAT64_PRIVATE}]:80", f"internet:{NAT64_PRIVATE}:tcp", "address_private"),
    (f"tcp:[{SIX_TO_FOUR_PRIVATE}]:80", f"internet:{SIX_TO_FOUR_PRIVATE}:tcp",
     "address_private"),
    (f"tcp:[{COMPATIBLE_PRIVATE}]:80", f"internet:{COMPATIBLE_PRIVATE}:tcp",
     "address_private"),
    # IPv6 outside global unicast carries no service the sandbox may reach: a translator's
    # local-use NAT64 prefix (RFC 8215) or IPv4-translated form (SIIT) may carry any IPv4
    # address (here the private host's), in a layout the guard cannot read
    (f"tcp:[{LOCAL_NAT64_PRIVATE}]:80", f"internet:{LOCAL_NAT64_PRIVATE}:tcp",
     "address_reserved"),
    (f"tcp:[{TRANSLATED_PRIVATE}]:80", f"internet:{TRANSLATED_PRIVATE}:tcp",
     "address_reserved"),
    (f"udp:[{GROUP6}]:7", f"internet:{GROUP6}:udp", "address_multicast"),
    (f"tcp:[{ROUTER_LINK6}%{LINK}]:80", f"internet:{ROUTER_LINK6}%inet:tcp",
     "address_link_local"),
    (f"udp:[{ROUTER_LINK6}%{LINK}]:7", f"internet:{ROUTER_LINK6}:udp", "address_link_local"),
    # (the host's own addresses: the guard refuses them first, and says so, issue 32)
    (f"tcp:[{HOST_LO6}]:80", f"host-address:{HOST_LO6}:tcp", "address_host_address"),
    (f"tcp:[{HOST6}]:80", f"host-address:{HOST6}:tcp", "address_host_address"),
]
# the host's loopback: the sandbox's own loopback answers, where nothing listens
HOSTS6 = [("tcp:[::1]:80", "host-loopback:::1:tcp")]
# an IPv4-mapped address is IPv4 on the wire: the IPv4 guard's
MAPPED = f"tcp:[::ffff:{PRIVATE}]:80"
OPEN6 = {f"tcp:[{PUBLIC6}]:80": f"internet {PUBLIC6}", f"udp:[{PUBLIC6}]:7": "ping",
         f"tcp:[{GLOBAL6}]:80": f"internet {GLOBAL6}",
         f"tcp:[{NAT64_PUBLIC}]:80": f"internet {NAT64_PUBLIC}",
         f"tcp:[{SIX_TO_FOUR_PUBLIC}]:80": f"internet {SIX_TO_FOUR_PUBLIC}",
         f"tcp:[{ROUTER6}]:80": f"internet {ROUTER6}", "dns6:public6.test": PUBLIC6}


def test_any_reaches_public_ipv6_hosts_and_no_guarded_form(tmp_path) -> None:
    targets = [*OPEN6, *(t for t, _, _ in GUARDED6), *(t for t, _ in HOSTS6), MAPPED]
    report = in_world(tmp_path, None, targets)
    attempts = report["attempts"]
    for target, answer in OPEN6.items():
        assert attempts[target] == answer, (target, report)
    for target in targets[len(OPEN6):]:
        assert attempts[target].startswith("error"), (target, report)
    seen = reached(report)
    assert not seen & {arrived for _, arrived, _ in GUARDED6}, report
    assert not seen & {arrived for _, arrived in HOSTS6}, report
    assert f"internet:{PRIVATE}:tcp" not in seen, report
    denied = {detail for kind, detail in report["result"]["violations"]
              if kind == "network.denied"}
    for target, _, reason in GUARDED6:
        where = target.partition(":")[2]
        address = where.rpartition(":")[0].strip("[]").partition("%")[0]
        assert f"{target.partition(':')[0]} {address}:{where.rpartition(':')[2]}: {reason}" \
            in denied, (target, report)



def test_reach_of_an_ipv6_range_lifts_the_guard_for_it_only(tmp_path) -> None:
    policy = {"network": {"mode": "any", "reach": ["fd00:9::/64", f"[{METADATA6}]:80"]}}
    targets = [f"tcp:[{ULA6}]:80", f"udp:[{ULA6}]:7", f"tcp:[{METADATA6}]:80",
               f"udp:[{METADATA6}]:7", f"tcp:[{SITE6}]:80"]
    report = in_world(tmp_path, policy, targets)
    attempts = report["attempts"]
    assert attempts[f"tcp:[{ULA6}]:80"] == f"internet {ULA6}", report
    assert attempts[f"udp:[{ULA6}]:7"] == "ping", report
    assert attempts[f"tcp:[{METADATA6}]:80"] == f"internet {METADATA6}", report
    assert attempts[f"udp:[{METADATA6}]:7"].startswith("error"), report
    assert attempts[f"tcp:[{SITE6}]:80"].startswith("error"), report
    assert reached(report) == {f"internet:{ULA6}:tcp", f"internet:{ULA6}:udp",
                               f"internet:{METADATA6}:tcp"}, report


def test_the_guard_is_what_keeps_the_ipv6_forms_out(tmp_path) -> None:
    """The mutation proof in the same world: with the guard's output chain off, the guarded
    forms the world serves off the sandbox's own link answer (so the test above would see
    them arrive if the guard forgot them)."""
    targets = [t for t, _, _ in GUARDED6]
    report = in_world(tmp_path, None, targets, ("address_guard",))
    expected = {f"internet:{address}:tcp" for address in (
        ULA6, METADATA6, SITE6, NAT64_PRIVATE, SIX_TO_FOUR_PRIVATE, COMPATIBLE_PRIVATE,
        LOCAL_NAT64_PRIVATE, TRANSLATED_PRIVATE)} | {
        f"internet:{ULA6}:udp", f"host-address:{HOST_LO6}:tcp"}
    assert not expected - reached(report), (expected - reached(report), report)


def test_the_guard_refuses_every_ipv6_address_the_proxy_refuses() -> None:
    """Pure logic: the guard's IPv6 table and the proxy's classification agree at the edges of
    every range either names (the documentation ranges aside, which the guard lets through
    for tests' own small internets, as it does for IPv4), the host's own addresses aside
    (the guard lists them apart)."""
    guarded = [net for net, _ in addresses.guarded_networks() if net.version == 6]
    named = guarded + [net for net, _ in addresses._V6] + [addresses._GLOBAL_UNICAST,
                                                          addresses._NAT64]
    samples = {ipaddress.IPv6Address(int(edge) + step) for net in named
               for edge in (net[0], net[-1]) for step in (-1, 0, 1)
               if 0 <= int(edge) + step < 1 << 128}
    samples |= {ipaddress.IPv6Address(a) for a in (
        LOCAL_NAT64_PRIVATE, TRANSLATED_PRIVATE, ULA6, METADATA6, SITE6, GROUP6, NAT64_PRIVATE,
        NAT64_PUBLIC, SIX_TO_FOUR_PRIVATE, COMPATIBLE_PRIVATE, GLOBAL6, "100::1", "5f00::1")}
    for address in sorted(samples):
        forbidden = addresses.classify(address)
        embedded = addresses._embedded(address)
        carried = [address, embedded[1]] if embedded else [address]
        if any(a in net for a in carried for net in addresses.DOCUMENTATION
               if net.version == a.version) or (forbidden and forbidden.kind == "host_address"):
            continue
        assert (forbidden is not None) == any(address in net for net in guarded), \
            (str(address), forbidden)


def test_the_guard_refuses_the_translated_forms_of_the_hosts_own_ipv4_addresses() -> None:
    """Pure logic: a translator on the way (NAT64's well-known prefix, 6to4) would lead the
    IPv6 form of one of the host's own IPv4 addresses back to the host; the guard's table
    holds both forms of each (independent attack N1: they were missing)."""
    from stockade.linux import guard

    text = guard.ruleset(["198.51.100.7", "2001:db8::7"], [], [])
    table = text.split("set guarded6", 1)[1].split("}", 1)[0]
    assert "64:ff9b::c633:6407" in table and "2002:c633:6407::/48" in table, table


# The child in allowlist mode: a CONNECT through the proxy for each target, its status line and
# what the world's server sent through the tunnel.
CONNECT = r"""
import json, os, socket, sys
proxy = os.environ["HTTP_PROXY"].rpartition("/")[2].rpartition(":")
for target in sys.argv[1:]:
    with socket.create_connection((proxy[0], int(proxy[2])), timeout=10) as c:
        c.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = c.makefile("rb").read().decode(errors="replace")
    print(json.dumps(["connect", target, answer.splitlines()[0] + " | " +
                      answer.rpartition("\r\n\r\n")[2].strip()]), flush=True)
"""


def test_the_allowlist_proxy_refuses_guarded_ipv6_literals_and_names(tmp_path) -> None:
    """allowlist mode in the same world: names allowed by the policy whose AAAA answers are a
    ULA host, the metadata address, a NAT64 form of the private host or a documentation
    address are refused (the proxy dials nothing there), as is an unlisted IPv6 literal; a
    name answering a global IPv6 host is reached."""
    allowed = ["global6.test:80", "ula.test:80", "metadata6.test:80", "nat64.test:80",
               "public6.test:80"]
    policy = {"network": {"mode": "allowlist", "allow": allowed}}
    targets = [*allowed, f"[{SITE6}]:80"]
    report = in_world(tmp_path, policy, targets, program=CONNECT)
    attempts = report["attempts"]
    assert attempts["connect:global6.test:80"].startswith("HTTP/1.1 200"), report
    assert attempts["connect:global6.test:80"].endswith(f"internet {GLOBAL6}"), report
    for target in targets[1:]:
        assert attempts[f"connect:{target}"].startswith("HTTP/1.1 403"), (target, report)
    assert reached(report) == {f"internet:{GLOBAL6}:tcp", "resolver:203.0.113.53:dns"}, report
    denied = " ".join(detail for kind, detail in report["result"]["violations"]
                      if kind == "network.denied")
    for reason in ("address_private", "address_metadata", "address_reserved", "not_allowed"):
        assert reason in denied, (reason, report)
