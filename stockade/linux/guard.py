"""The destination guard of `network.mode = "any"`: nftables rules in the sandbox's own network
namespace, and the log of what they refused.

The sandbox's traffic leaves its namespace through user-mode networking (usernet.py), which
dials from the host as the host user: anything the host can reach, the sandbox could. The
guard refuses, in the namespace's output hook, every packet to a guarded destination
(addresses.guarded_networks: loopback, link-local, cloud metadata, private and reserved
ranges, and the host's own addresses) but what the policy lists in `network.reach` and the
host's DNS resolvers on port 53. The sandbox's own loopback stays open (it is not the host's).

In the input hook it lets in only what the namespace's connection tracking knows as a reply to
(or an error about) what the sandbox sent, and the neighbour discovery IPv6 needs: pasta keeps
a host UDP socket open for each source port the sandbox used and relays whatever arrives there,
from any sender, so without this rule anyone who can reach the host could reach the sandbox.
That socket is bound to the very port the sandbox sent from, on all the host's addresses; so
the guard's postrouting hook gives every UDP datagram leaving the namespace a source port from
the host's ephemeral range (`ports`), as the host's kernel gives any client: the sandbox cannot
choose which host port pasta takes (a service's port, before the service binds it).

pid 1 installs the rules while it still holds CAP_NET_ADMIN over the namespace, before any
route out exists; the command gets no capability, so it can neither change nor remove them.
Each refusal is logged to an NFLOG group, whose netlink socket pid 1 binds and passes out: the
owner reads the records (`records`) as the proxy's denials are read. The log is limited
(LOG_RATE), so every refusal is also counted (the table's counter `refused`), which the owner
reads through the same socket once the run is over (`refused`): what the count exceeds the
records by was dropped, and the result says so.
"""

from __future__ import annotations

import errno
import ipaddress
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from stockade.errors import SetupError
from stockade.net import addresses
from stockade.policy.reach import parse_reach

TABLE = "stockade_guard"
COUNTER = "refused"
GROUP = 7           # the NFLOG group (per network namespace)
LOG_RATE = "50/second"  # a command looping on refused connections cannot flood the log
TOOL_DIRS = "/usr/sbin:/sbin:/usr/bin:/bin"
INSTALL_TIMEOUT = 10.0
CAP_NET_ADMIN = 12

NETLINK_NETFILTER = 12
_NFNL_SUBSYS_ULOG = 4
_MSG_PACKET, _MSG_CONFIG = 0, 1
_CFG_CMD, _CFG_MODE, _CFG_TIMEOUT, _CFG_QTHRESH = 1, 2, 4, 5
_CMD_BIND = 1
_COPY_PACKET = 2
_PAYLOAD, _PREFIX = 9, 10
_NLM_F_REQUEST, _NLM_F_ACK = 1, 4
_NFNL_SUBSYS_NFTABLES, _NFT_MSG_NEWOBJ, _NFT_MSG_GETOBJ = 10, 18, 19
_NFTA_OBJ_TABLE, _NFTA_OBJ_NAME, _NFTA_OBJ_TYPE, _NFTA_OBJ_DATA = 1, 2, 3, 4
_NFT_OBJECT_COUNTER, _NFTA_COUNTER_PACKETS = 1, 2
_NFPROTO_INET = 1
QUERY_TIMEOUT = 2.0
_NLMSG_ERROR = 2
_HEADER = struct.Struct("=IHHII")
_PROTOCOLS = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6", 132: "sctp"}


def nft_path() -> str | None:
    """The nft program, looked up in the system's tool directories only."""
    return shutil.which("nft", path=TOOL_DIRS)


def ruleset(host: Iterable[str], resolvers: Iterable[str], reach: Sequence[str],
            guarded: bool = True, relay: str | None = None, inbound: bool = True,
            ports: tuple[int, int] | None = None) -> str:
    """The guard's nftables ruleset. `host`: the host's own addresses; `resolvers`: the DNS
    servers the sandbox may ask (port 53); `relay`: pasta's DNS forward (UDP port 53 only:
    pasta relays no TCP there, which would leave for that address itself); `reach`:
    network.reach entries. Not `guarded` (tests only): the output chain refuses nothing; not
    `inbound` (tests only): there is no input chain, and whatever pasta relays gets in;
    `ports`: the range UDP source ports are remapped into (None, tests only: kept as sent)."""
    nets = {4: [], 6: []}
    for net, _ in addresses.guarded_networks():
        nets[net.version].append(str(net))
    for text in host:
        address = ipaddress.ip_address(text)
        nets[address.version].append(str(address))
        if address.version == 4:
            nets[6] += map(str, addresses.carried_forms(ipaddress.IPv4Network(address)))
    lines = [f"table inet {TABLE} {{", f"  counter {COUNTER} {{ }}"]
    for version in (4, 6):
        kind = "ipv4_addr" if version == 4 else "ipv6_addr"
        elements = ", ".join(sorted(set(nets[version])))
        lines += [f"  set guarded{version} {{ type {kind}; flags interval; auto-merge;",
                  f"    elements = {{ {elements} }} }}"]
    own = {4: [], 6: []}
    for address in own_addresses(host):
        own[address.version].append(str(address))
    lines += ["  chain output {",
              "    type filter hook output priority 0; policy accept;"]
    # (pasta gives the sandbox the host's address, so a connection to it stays inside, over
    # "lo": refused and logged here, first, whatever reach lists, rather than meet a closed port)
    for version in (4, 6) if guarded else ():
        if own[version]:
            family, elements = _family(version), ", ".join(sorted(own[version]))
            # (not ICMP: the reject's own error goes to that address too, and must arrive)
            match = f"{family} daddr {{ {elements} }} meta l4proto != {{ icmp, ipv6-icmp }}"
            lines += [f"    {match} limit rate {LOG_RATE} log group {GROUP}",
                      f'    {match} counter name "{COUNTER}" '
                      "reject with icmpx type admin-prohibited"]
    lines += ['    oifname "lo" accept',
              # (the kernel's own neighbour discovery: without it IPv6 has no next hop)
              "    ip6 daddr { fe80::/10, ff02::/16 } icmpv6 type { nd-neighbor-solicit, "
              "nd-neighbor-advert, nd-router-solicit, mld-listener-report, "
              "mld2-listener-report } accept"]
    if relay is not None:
        lines.append(f"    {_family(ipaddress.ip_address(relay).version)} daddr {relay} "
                     "udp dport 53 accept")
    for text in resolvers:
        family = _family(ipaddress.ip_address(text).version)
        lines += [f"    {family} daddr {text} udp dport 53 accept",
                  f"    {family} daddr {text} tcp dport 53 accept"]
    for entry in map(parse_reach, reach):
        family = _family(entry.network.version)
        if entry.port is None:
            lines.append(f"    {family} daddr {entry.network} accept")
        else:
            lines += [f"    {family} daddr {entry.network} {proto} dport {entry.port} accept"
                      for proto in ("tcp", "udp")]
    if guarded:
        for version in (4, 6):
            family = _family(version)
            lines += [f"    {family} daddr @guarded{version} limit rate {LOG_RATE} "
                      f"log group {GROUP}",
                      f'    {family} daddr @guarded{version} counter name "{COUNTER}" '
                      "reject with icmpx type admin-prohibited"]
    lines.append("  }")
    if inbound:
        lines += ["  chain input {",
                  "    type filter hook input priority 0; policy drop;",
                  '    iifname "lo" accept',
                  "    ct state established,related accept",
                  "    ip6 saddr fe80::/10 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, "
                  "nd-router-advert } accept",
                  "  }"]
    if ports is not None:
        lines += ["  chain postrouting {",
                  "    type nat hook postrouting priority srcnat; policy accept;",
                  f'    oifname != "lo" meta l4proto udp masquerade to :{ports[0]}-{ports[1]} '
                  "random",
                  "  }"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def own_addresses(host: Iterable[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The host's own addresses `host` the sandbox would hold too: not loopback or link-local
    (those in the sandbox are its own), nor a multicast group the host joined."""
    found = (ipaddress.ip_address(text) for text in host)
    return [a for a in found if not (a.is_loopback or a.is_link_local or a.is_multicast)]


def _family(version: int) -> str:
    return "ip" if version == 4 else "ip6"


def install(nft: str, text: str) -> None:
    """Load `text` into this process's network namespace; SetupError if nft refuses."""
    try:
        done = subprocess.run([nft, "-f", "-"], input=text.encode(), capture_output=True,
                              timeout=INSTALL_TIMEOUT, env={"PATH": TOOL_DIRS}, check=False,
                              preexec_fn=_with_net_admin)  # noqa: PLW1509 - pid 1: one thread
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError("network_guard_failed", f"nft could not run: {exc}",
                         stage="network") from None
    if done.returncode:
        message = done.stderr.decode(errors="replace").strip().splitlines()[:3]
        raise SetupError("network_guard_failed", "nft refused the destination guard: "
                         + " / ".join(message), stage="network")


def _with_net_admin() -> None:
    from stockade.linux.privilege import keep_across_exec

    keep_across_exec(CAP_NET_ADMIN)


def log_socket() -> socket.socket:
    """A netlink socket bound to the guard's NFLOG group in this network namespace (needs
    CAP_NET_ADMIN over it), copying enough of each refused packet for its destination."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
        _configure(sock, 1, _attribute(_CFG_CMD, struct.pack("B3x", _CMD_BIND)))
        _configure(sock, 2, _attribute(_CFG_MODE, struct.pack(">IBx", 64, _COPY_PACKET)))
        # each record at once, not batched for up to a second
        _configure(sock, 3, _attribute(_CFG_QTHRESH, struct.pack(">I", 1))
                   + _attribute(_CFG_TIMEOUT, struct.pack(">I", 0)))
    except OSError as exc:
        sock.close()
        raise SetupError("network_guard_failed", f"the guard's log could not be bound: "
                         f"{exc.strerror or exc}", stage="network") from None
    return sock


def _configure(sock: socket.socket, sequence: int, attribute: bytes) -> None:
    body = struct.pack(">BBH", socket.AF_UNSPEC, 0, GROUP) + attribute
    kind = (_NFNL_SUBSYS_ULOG << 8) | _MSG_CONFIG
    sock.send(_HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK,
                           sequence, 0) + body)
    reply = sock.recv(4096)
    length, kind, _, _, _ = _HEADER.unpack_from(reply)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, _HEADER.size)
        if error:
            raise OSError(-error, f"NFLOG configuration refused ({-error})")


def _attribute(kind: int, value: bytes) -> bytes:
    size = 4 + len(value)
    return struct.pack("=HH", size, kind) + value + b"\0" * (-size % 4)


def records(sock: socket.socket, request_id: str) -> list[dict]:
    """Every refusal logged since the last call (without blocking), as the proxy's decision
    log writes its denials (net/log.py)."""
    found: list[dict] = []
    while True:
        try:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return found
        except OSError:  # (ENOBUFS: records were lost; the ones still queued follow)
            continue
        if not data:
            return found
        found += [_record(packet, request_id) for packet in _packets(data)]


def refused(sock: socket.socket, request_id: str) -> tuple[int | None, list[dict]]:
    """The guard's count of refused packets, asked through the log socket (pid 1 opened it
    with CAP_NET_ADMIN over the sandbox's network namespace, which the owner holds too), and
    the records read on the way; None when the count could not be read."""
    body = struct.pack(">BBH", _NFPROTO_INET, 0, 0)
    body += _attribute(_NFTA_OBJ_TABLE, TABLE.encode() + b"\0")
    body += _attribute(_NFTA_OBJ_NAME, COUNTER.encode() + b"\0")
    body += _attribute(_NFTA_OBJ_TYPE, struct.pack(">I", _NFT_OBJECT_COUNTER))
    kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETOBJ
    found: list[dict] = []
    try:
        sock.send(_HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST, 0, 0) + body)
    except OSError:
        return None, found
    sock.settimeout(QUERY_TIMEOUT)
    try:
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return None, found
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # (log records lost: the count has them)
                    continue
                return None, found
            found += [_record(packet, request_id) for packet in _packets(data)]
            answer = _counted(data)
            if answer is not False:
                return answer, found
    finally:
        sock.settimeout(None)


def _counted(data: bytes) -> int | None | bool:
    """The counter's packets in a reply among `data`'s messages; None for an error reply;
    False when `data` holds no reply."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            break
        if kind == _NLMSG_ERROR:
            return None
        if kind == (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWOBJ:
            for attribute, value in _attributes(data, offset + _HEADER.size + 4,
                                                offset + length):
                if attribute == _NFTA_OBJ_DATA:
                    for inner, number in _attributes(value, 0, len(value)):
                        if inner == _NFTA_COUNTER_PACKETS:
                            return struct.unpack(">Q", number[:8])[0]
            return None
        offset += length + (-length % 4)
    return False


def _attributes(data: bytes, at: int, end: int) -> list[tuple[int, bytes]]:
    found = []
    while at + 4 <= end:
        size, attribute = struct.unpack_from("=HH", data, at)
        if size < 4:
            break
        found.append((attribute & 0x3FFF, data[at + 4:at + size]))
        at += size + (-size % 4)
    return found


def _packets(data: bytes) -> list[bytes]:
    """The payloads (the refused packets' first bytes) of the NFLOG messages in `data`."""
    packets, offset = [], 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size:
            break
        if kind == (_NFNL_SUBSYS_ULOG << 8) | _MSG_PACKET:
            at, end = offset + _HEADER.size + 4, offset + length
            while at + 4 <= end:
                size, attribute = struct.unpack_from("=HH", data, at)
                if size < 4:
                    break
                if attribute & 0x3FFF == _PAYLOAD:
                    packets.append(data[at + 4:at + size])
                at += size + (-size % 4)
        offset += length + (-length % 4)
    return packets


def _record(packet: bytes, request_id: str) -> dict:
    destination, protocol, port = _destination(packet)
    address = ipaddress.ip_address(destination) if destination else None
    forbidden = addresses.classify(address) if address else None
    if address and own_addresses([destination]) and addresses.is_host_address(address):
        kind = "host_address"  # (refused first, reach or not: see ruleset)
        message = (f"{destination} is this host's own address, which in the sandbox is its "
                   "own (pasta gives it the host's address): a host service is reached "
                   'through the proxy: network.mode = "allowlist" with allow = '
                   f'["{destination}:PORT"]')
    else:
        kind = forbidden.kind if forbidden else "host_address"
        message = (f"{destination} is {forbidden.describe() if forbidden else 'guarded'}; "
                   "only what network.reach lists may be reached past the destination guard")
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "request_id": request_id, "protocol": protocol, "host": destination, "port": port,
        "decision": "deny", "rule": None, "reason": f"address_{kind}", "message": message,
        "address": destination,
    }


def _destination(packet: bytes) -> tuple[str, str, int]:
    """(destination address, protocol, destination port or 0) of an IP packet's header."""
    if len(packet) >= 20 and packet[0] >> 4 == 4:
        header, number = (packet[0] & 0xF) * 4, packet[9]
        address = str(ipaddress.IPv4Address(packet[16:20]))
    elif len(packet) >= 40 and packet[0] >> 4 == 6:
        header, number = 40, packet[6]
        address = str(ipaddress.IPv6Address(packet[24:40]))
    else:
        return "", "ip", 0
    port = 0
    if number in (6, 17, 132) and len(packet) >= header + 4:
        port = struct.unpack_from(">H", packet, header + 2)[0]
    return address, _PROTOCOLS.get(number, str(number)), port
