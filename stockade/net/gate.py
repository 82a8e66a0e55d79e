"""The whole decision for one destination: patterns, one resolution, address checks, the dial.

The host is resolved once; every answer is checked; only checked addresses are dialled (never
the name again, so a second DNS answer cannot swap in another address). A name resolving to a
forbidden address is refused unless the policy's allow list names that address literally
(with the port); a literal deny pattern also applies to resolved addresses. DNS answers never
become rules.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stockade.net import addresses
from stockade.net.approve import ALLOW_ONCE, ASKED, DENY, Approval, Ask
from stockade.net.rules import RuleDecision, Ruleset, host_form, target_host

Resolver = Callable[[str], Sequence[str]]
# (checked addresses, port, timeout, a hook that sees each socket first) -> a connected socket
Dialer = Callable[[Sequence[str], int, float, Callable[[socket.socket], None]], socket.socket]

_MAX_SHOWN = 255


def system_resolver(host: str) -> list[str]:
    """The host's resolver (getaddrinfo), answers in its order of preference, deduplicated."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Verdict:
    """`decision` is allow, deny or error; `addresses` are the checked ones to dial."""

    decision: str
    host: str
    port: int
    reason: str
    message: str
    rule: str | None = None
    address: str | None = None
    addresses: tuple[str, ...] = ()


_RULE_MESSAGES = {
    "denied_by_rule": "matches network.deny pattern {rule}",
    "port_not_allowed": "port {port} is not allowed by {rule} (a pattern without :port allows "
                        "ports 80 and 443 only)",
    "not_allowed": "not in network.allow",
}


class Gate:
    """Decides destinations for one policy. `unchecked` (tests only: the evidence matrix shows
    that its rows notice) skips the name and port patterns ("rules") or the address checks
    ("addresses")."""

    def __init__(self, rules: Ruleset, resolver: Resolver | None = None,
                 unchecked: frozenset[str] = frozenset(), approval: Approval | None = None,
                 credentials: Callable[[str, int], tuple[str, ...]] = lambda h, p: ()) -> None:
        self.rules = rules
        self.resolver = resolver or system_resolver
        self.unchecked = unchecked
        self.approval = approval  # (approve.py: asked about a destination outside the allow list)
        self.credentials = credentials  # (host, port) -> the names of its credentials

    def decide(self, host: str, port: int) -> Verdict:
        try:
            name = target_host(host)
        except ValueError:
            return Verdict("deny", host[:_MAX_SHOWN], port, "invalid_host", "not a valid host")
        if not 1 <= port <= 65535:
            return Verdict("deny", name, port, "invalid_port", "not a valid port")
        by_rule = self.rules.decide(name, port)
        asked = False
        if not by_rule.allowed and by_rule.reason in ASKED and self.approval is not None:
            asked = True
            answer = self.approval.answer(Ask(name, port, by_rule.reason,
                                              self.credentials(name, port)))
            if answer != DENY:  # (the address checks below still apply)
                by_rule = RuleDecision(True, "approved_once" if answer == ALLOW_ONCE
                                       else "approved_for_run", f"approved {name}:{port}")
        if not by_rule.allowed and "rules" not in self.unchecked:
            message = _RULE_MESSAGES[by_rule.reason].format(rule=by_rule.rule, port=port)
            if asked:
                message += " (the caller was asked, and did not approve it in time)"
            return Verdict("deny", name, port, by_rule.reason, message, by_rule.rule)
        try:
            answers = self._resolve(name)
        except Exception as exc:  # a resolver is a plug-in: any failure means "unresolved"
            return Verdict("error", name, port, "resolve_failed", f"cannot resolve: {exc}",
                           by_rule.rule)
        checked, refusals = [], []
        for address in answers:
            problem = None if "addresses" in self.unchecked else self._refuse(address, port)
            if problem is None:
                checked.append(str(addresses.unmap(address)))
            else:
                refusals.append(Verdict("deny", name, port, *problem, address=str(address)))
        if not checked:
            return refusals[0]
        return Verdict("allow", name, port, by_rule.reason,
                       "approved by the caller" if asked else "allowed", by_rule.rule,
                       addresses=tuple(checked))

    def _resolve(self, name: str) -> list[addresses.IPAddress]:
        literal = name[1:-1] if name.startswith("[") else name
        try:
            return [ipaddress.ip_address(literal)]
        except ValueError:
            pass
        answers = []
        for text in self.resolver(name):
            try:
                answers.append(ipaddress.ip_address(text))
            except ValueError:
                continue
        if not answers:
            raise ValueError("no address")
        return answers

    def _refuse(self, address: addresses.IPAddress,
                port: int) -> tuple[str, str, str | None] | None:
        """(reason, message, rule) refusing a resolved address, or None if it may be dialled."""
        plain = addresses.unmap(address)
        literal = self.rules.decide(host_form(plain), port)
        if literal.reason == "denied_by_rule":
            return ("denied_by_rule", f"resolves to {plain}, which matches network.deny "
                    f"pattern {literal.rule}", literal.rule)
        if literal.allowed:
            return None
        forbidden = addresses.classify(plain)
        if forbidden is None:
            return None
        literal_rule = f"{host_form(plain)}:{port}"
        return (f"address_{forbidden.kind}", f"resolves to {address}, {forbidden.describe()}; "
                "only an address listed literally in network.allow may be reached: if it is "
                f'meant, allow "{literal_rule}" (--allow-domain {literal_rule})', None)


def dial(candidates: Sequence[str], port: int, timeout: float,
         on_socket: Callable[[socket.socket], None]) -> socket.socket:
    """Connect to the first checked address that answers; the last OSError if none does.

    `on_socket` sees each socket before it connects (so the proxy can abort it on stop).
    """
    error: OSError = OSError("no address to dial")
    for text in candidates:
        family = socket.AF_INET6 if ":" in text else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            on_socket(sock)
            sock.settimeout(timeout)
            sock.connect((text, port))
        except ConnectionResetError:
            # It answered, then reset before the connect call returned (a connect with a
            # timeout reads SO_ERROR after the handshake): the tunnel ends at once, which is
            # what the client must see, rather than a failed dial.
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            continue
        with contextlib.suppress(OSError):  # (the same race, a moment later)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error
