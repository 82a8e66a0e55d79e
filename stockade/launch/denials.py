"""What the sandbox stopped or cut, in words, with the policy grant that would allow it: the
one rendering every integration puts in the tool result its model reads and `stockade run`
(`sandbox-exec`, `exec`, `session exec`) prints on stderr after the command ends, so that an
agent does not take a denial for a missing file or a flaky network and retry around it.

A `Violation` (launch/result.py) becomes a `Denial`, the violation with its grant (`denial`),
and each Denial one line, "stockade: WHAT; the policy grant that would allow it: GRANT"
(`denial_lines`). The grant is a policy setting (`network.allow host:port`, `limits.timeout`,
`filesystem.protected`, ...); None where no setting allows it (a credential sent to another
host, code the host would run), and the line then says why instead."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from stockade.launch.result import Violation

_GRANTS = {"limits.timeout": "limits.timeout", "limits.output": "limits.output",
           "limits.memory": "limits.memory", "filesystem.protected": "filesystem.protected",
           "filesystem.git": "filesystem.git",
           "filesystem.home": 'filesystem.home "private"'}  # (host code: no grant makes it)


@dataclass(frozen=True)
class Denial:
    """A violation, with the policy grant that would have allowed it (None: no grant can, or,
    for a `limits.timeout` that the call's own shorter timeout set, a longer one for the call
    would)."""

    kind: str
    detail: str
    grant: str | None
    # A network denial's record (launch/result.py's Violation.network): what its grant and
    # words are made from.
    network: tuple[str, str, int, str, str] | None = None


# What a model reads for a denial of each kind (`detail` is the violation's): what the sandbox
# stopped or cut. Any other kind is said as "denied KIND: DETAIL".
_SAID = {
    "limits.timeout": "the command was {detail}, the sandbox's time limit",
    "limits.output": "{detail}, the sandbox's output limit: the rest of it was dropped",
    "limits.memory": "the sandbox's memory limit refused memory: {detail}",
    "filesystem.protected": "the sandbox did not make a protected name: {detail}",
    "filesystem.host_code": "the sandbox did not make code the host would run: {detail}",
    "filesystem.git": "the sandbox's git guard refused a write: {detail}",
    "filesystem.home": "the sandbox's home is read-only: {detail}",
    "sandbox.lost": "the sandbox was lost: the command ended its agent (as kill -9 -1 does), "
                    "and everything in it with it; the next command runs in a new sandbox",
    "cancelled": "the command was {detail}",
    "network.denied_unrecorded": "the sandbox's destination guard refused more than it "
                                 "recorded: {detail}",
    "output_failed": "the command's output was not all relayed: {detail}",
    "supervisor.status_ignored": "the sandbox's status pipe carried what is not its events: "
                                 "{detail}",
}
_CALL_TIMEOUT = ("the command was {detail}, the timeout this call asked for (shorter than the "
                 "sandbox's time limit, limits.timeout): a longer one would let it run on")

# Why the network refused, by the record's reason (net/gate.py, net/inspect.py, net/proxy.py;
# the destination guard of mode "any": linux/guard.py); an `address_*` reason is said by its
# record's own message, which the detail carries.
_NETWORK_SAID = {
    "not_allowed": "the host is not in network.allow",
    "port_not_allowed": "network.allow names the host, not this port",
    "denied_by_rule": "a network.deny pattern matches it",
    "method_not_allowed": "network.http allows other methods for this host",
    "path_not_allowed": "the path is not under network.http's paths for this host",
    "path_ambiguous": "the path is ambiguous, so network.http's paths for this host cannot "
                      "judge it (no grant allows it: send the plain path)",
    "credential_exfiltration": "it carried a credential's placeholder or secret to a host "
                               "other than the credential's own (an exfiltration attempt: no "
                               "grant allows it)",
    "credential_needs_https": "a credential is sent over HTTPS only (no grant allows plain "
                              "HTTP: use https://)",
    "credential_reflected": "the response carried a credential's secret, and was cut before "
                            "it (no grant allows it)",
    "credential_response_unreadable": "the response of a credential's host could not be "
                                      "checked for its secret (no grant allows it)",
    "ambiguous_framing": "the request's end is ambiguous (Content-Length and "
                         "Transfer-Encoding; no grant allows it)",
    "socks_to_inspected_host": "a host network.credentials or network.http names is reached "
                               "through the HTTP proxy only, not SOCKS (no grant allows it)",
}
_PROXY_PROTOCOLS = ("connect", "http", "https", "socks5")  # (the guard's: tcp, udp, ...)


def denial(violation: Violation) -> Denial:
    """`violation` with the grant that would have allowed it."""
    if violation.kind == "network.denied":
        return Denial(violation.kind, violation.detail, _network_grant(violation.network),
                      violation.network)
    return Denial(violation.kind, violation.detail, _GRANTS.get(violation.kind))


def _network_grant(record: tuple[str, str, int, str, str] | None) -> str | None:
    """The grant of a network denial, from its record's fields (launch/result.py's
    network_denials; never from the detail's text, whose host the command chose): the proxy's
    protocols are connect, http, socks5 and https (a request read inside an intercepted
    tunnel), the destination guard's (network "any") tcp, udp, ..."""
    if record is None:
        return None
    protocol, host, port, reason, address = record
    bare = host.strip("[]")
    destination = f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
    if protocol not in _PROXY_PROTOCOLS:
        if reason == "address_host_address":  # (refused reach or not: the proxy reaches it)
            return f'network.mode "allowlist" with network.allow {destination}'
        return f"network.reach {destination}"
    if reason in ("not_allowed", "port_not_allowed"):
        return f"network.allow {destination}"
    if reason == "denied_by_rule":
        return f"network.deny without the pattern that matches {host}"
    if reason == "method_not_allowed":
        return f"network.http methods for {host}"
    if reason == "path_not_allowed":
        return f"network.http paths for {host}"
    if reason.startswith("address_"):  # (a literal address, or what a name resolved to)
        return f"network.allow {_literal(address, port) if address else destination}"
    return None


def _literal(address: str, port: int) -> str:
    """How network.allow lists `address` literally (the gate's advice: IPv4 for a mapped
    IPv6 address, IPv6 in brackets)."""
    ip = ipaddress.ip_address(address.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _said(d: Denial) -> str:
    if d.kind == "limits.timeout" and d.grant is None:
        return _CALL_TIMEOUT.format(detail=d.detail)
    if d.kind == "network.denied" and d.network is not None:
        protocol, _, _, reason, address = d.network
        proxy = protocol in _PROXY_PROTOCOLS
        why = _NETWORK_SAID.get(reason)
        if reason.startswith("address_") and not address:  # (else its message says why)
            why = ("a guarded address, which the proxy reaches only where network.allow lists "
                   "it literally") if proxy else ("a guarded address, which only network.reach "
                                                  "lets past the destination guard")
        who = "proxy" if proxy else "destination guard"
        return f"the sandbox's network {who} refused {d.detail}" + (f": {why}" if why else "")
    return _SAID.get(d.kind, "denied {kind}: {detail}").format(kind=d.kind, detail=d.detail)


def denial_lines(denials: Iterable[Denial]) -> list[str]:
    """Each denial in words, for the tool result a model reads and the CLI's stderr: what the
    sandbox stopped or cut, and the policy grant that would allow it ("stockade: ...", one
    line each)."""
    lines = []
    for d in denials:
        grant = f"; the policy grant that would allow it: {d.grant}" if d.grant else ""
        lines.append(f"stockade: {_said(d)}{grant}")
    return lines


def with_denials(text: str, denials: Iterable[Denial]) -> str:
    """`text` (a command's output) followed by `denial_lines`, each on a line of its own."""
    lines = denial_lines(denials)
    if not lines:
        return text
    return text + ("\n" if text and not text.endswith("\n") else "") + "\n".join(lines) + "\n"
