"""Network domain patterns, as named by `network.allow` and `network.deny`.

Accepted, and normalised (lower case, compressed IPv6, port without leading zeros):

- `example.com`: exactly that host;
- `*.example.com`: strict subdomains of example.com, not example.com itself; the suffix needs
  at least two labels, so `*.com` is refused;
- `192.0.2.1`, `[2001:db8::1]`: that address (IPv6 in brackets);
- any of these with `:443`: only that port (1-65535).

Refused: a bare `*`, schemes, paths, user info, empty labels, labels over 63 characters, names
over 253, non-ASCII (write the `xn--` form), characters other than letters, digits and `-`.
"""

from __future__ import annotations

import ipaddress
import re

from stockade.policy.render import show

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
_MAX_NAME = 253
_MAX_PORT = 65535


class _Refused(Exception):
    """What is wrong with a pattern (the caller adds the pattern itself)."""


def normalise_pattern(value: object) -> str:
    """The normalised form of a domain pattern; ValueError naming the problem if invalid."""
    if not isinstance(value, str):
        raise ValueError(f'expected a domain pattern such as "example.com", got {show(value)}')
    try:
        return _normalise(value)
    except _Refused as exc:
        raise ValueError(f"{exc}, got {show(value)}") from None


def _normalise(text: str) -> str:
    if not text:
        raise _Refused('expected a domain pattern such as "example.com"')
    if not text.isascii():
        raise _Refused("expected an ASCII domain pattern (write a non-ASCII name in its xn-- form)")
    if "://" in text:
        raise _Refused('expected a domain pattern, not a URL (drop the "scheme://")')
    if "/" in text:
        raise _Refused("expected a domain pattern without a path")
    if "@" in text:
        raise _Refused("expected a domain pattern without user info")
    if text.startswith("["):
        address, bracket, port = text[1:].partition("]")
        if not bracket:
            raise _Refused('expected "]" after a bracketed IPv6 address')
        if port and not port.startswith(":"):
            raise _Refused('expected ":port" after a bracketed IPv6 address')
        host = _ipv6(address)
    else:
        if text.count(":") > 1:
            raise _Refused('expected an IPv6 address in brackets, as in "[::1]:443"')
        name, colon, digits = text.partition(":")
        port = colon + digits
        host = _hostname(name.lower())
    return host + (f":{_port(port[1:])}" if port else "")


def _ipv6(address: str) -> str:
    try:
        if "%" in address:
            raise ValueError
        return f"[{ipaddress.IPv6Address(address).compressed}]"
    except ValueError:
        raise _Refused("expected a valid IPv6 address inside the brackets") from None


def _hostname(name: str) -> str:
    if name == "*":
        raise _Refused('a bare "*" is not allowed (use network.mode = "any")')
    wildcard = name.startswith("*.")
    labels = (name[2:] if wildcard else name).split(".")
    if "" in labels:
        raise _Refused("expected a host name without empty labels")
    if any("*" in label for label in labels):
        raise _Refused('a wildcard may only be a whole first label, as in "*.example.com"')
    if labels[-1].isdigit():
        return _ipv4(name, wildcard)
    if wildcard and len(labels) < 2:
        raise _Refused('a wildcard needs a suffix of at least two labels, as in "*.example.com"')
    if any(len(label) > 63 for label in labels):
        raise _Refused("expected host name labels of at most 63 characters")
    if len(name) > _MAX_NAME:
        raise _Refused(f"expected a host name of at most {_MAX_NAME} characters")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise _Refused('expected host name labels of letters, digits and inner "-"')
    return name


def _ipv4(name: str, wildcard: bool) -> str:
    if wildcard:
        raise _Refused("a wildcard applies to domain names, not IP addresses")
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        raise _Refused("expected a valid IPv4 address (a host name cannot end in digits)") from None


def _port(digits: str) -> int:
    if not (digits.isdigit() and len(digits) <= 5 and 1 <= int(digits) <= _MAX_PORT):
        raise _Refused(f"expected a port from 1 to {_MAX_PORT}")
    return int(digits)
