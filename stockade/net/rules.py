"""Decide a destination `host:port` against `network.allow` and `network.deny` patterns.

Patterns are validated and normalised by `stockade.policy.domains`; this module only matches.

- `example.com` matches that host exactly (case-insensitive, one trailing dot ignored);
- `*.example.com` matches strict subdomains (`a.example.com`, `a.b.example.com`), never
  `example.com` itself;
- an IP pattern (`192.0.2.1`, `[2001:db8::1]`) matches that address only: a name pattern never
  matches an address and an address pattern never matches a name;
- ports: an allow pattern without `:port` allows ports 80 and 443 only (web traffic, the common
  case; anything else, such as `github.com:22`, must be listed with its port). A deny pattern
  without `:port` denies every port, so a deny is never narrower than it reads.
- deny is checked before allow; nothing matches unless allowed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from stockade.errors import PolicyError
from stockade.policy.domains import normalise_pattern

DEFAULT_PORTS = (80, 443)


@dataclass(frozen=True)
class Rule:
    """One normalised pattern: `host` is a name, `*.suffix`, IPv4 or `[IPv6]`."""

    pattern: str
    host: str
    port: int | None

    def matches_host(self, host: str) -> bool:
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


@dataclass(frozen=True)
class RuleDecision:
    """The verdict of the patterns alone; `rule` is the pattern that decided, if any."""

    allowed: bool
    reason: str
    rule: str | None = None


def compile_rules(patterns: Iterable[str], key: str) -> tuple[Rule, ...]:
    """Rules from policy patterns; PolicyError naming `key` if one is invalid."""
    rules = []
    for value in patterns:
        try:
            pattern = normalise_pattern(value)
        except ValueError as exc:
            raise PolicyError(str(exc), key=key) from None
        if pattern.startswith("["):
            address, _, rest = pattern.partition("]")
            host, port = address + "]", rest[1:]
        else:
            host, _, port = pattern.partition(":")
        rules.append(Rule(pattern, host, int(port) if port else None))
    return tuple(rules)


def target_host(host: str) -> str:
    """The normalised form of a requested host, comparable with rule hosts; ValueError if invalid.

    Accepts a name, an IPv4 address, or an IPv6 address with or without brackets. Only the
    canonical dotted IPv4 form is an address: `127.1` or `0x7f.0.0.1` are refused, not guessed.
    """
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in text:
        text = f"[{text}]"
    elif text.endswith("."):
        text = text[:-1]
    if "*" in text:
        raise ValueError("a wildcard is not a host")
    return normalise_pattern(text)


def host_form(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """How an address is written as a rule host (IPv6 compressed, in brackets)."""
    return f"[{address.compressed}]" if address.version == 6 else str(address)


class Ruleset:
    """Compiled allow and deny lists."""

    def __init__(self, allow: Iterable[str], deny: Iterable[str] = ()) -> None:
        self.allow = compile_rules(allow, "network.allow")
        self.deny = compile_rules(deny, "network.deny")

    def decide(self, host: str, port: int) -> RuleDecision:
        """Decide a normalised host (see `target_host`) and port: deny first, then allow."""
        for rule in self.deny:
            if rule.matches_host(host) and rule.port in (None, port):
                return RuleDecision(False, "denied_by_rule", rule.pattern)
        port_miss = None
        for rule in self.allow:
            if rule.matches_host(host):
                if port in ((rule.port,) if rule.port else DEFAULT_PORTS):
                    return RuleDecision(True, "allowed_by_rule", rule.pattern)
                port_miss = port_miss or rule
        if port_miss:
            return RuleDecision(False, "port_not_allowed", port_miss.pattern)
        return RuleDecision(False, "not_allowed")
