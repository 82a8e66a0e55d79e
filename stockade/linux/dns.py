"""The sandbox's own resolver configuration for `network.mode = "any"`.

The host's /etc/resolv.conf is often of no use inside a sandbox with a network of its own: it
names a resolver on the host's loopback (systemd-resolved's 127.0.0.53, a local dnsmasq),
which is the sandbox's own loopback there, or it is a symbolic link into /run, which the view
does not hold. So the sandbox gets a file of its own in its place (mnt.py) naming FORWARD —
an address pasta answers itself (`--dns-forward`), relaying each query to the host's first
IPv4 resolver, on the host's loopback or not — and the host's other resolvers that are off
its loopback. The host's search domains and options are kept.
"""

from __future__ import annotations

import ipaddress
import os
import stat

HOST_CONF = "/etc/resolv.conf"
FORWARD = "169.254.1.1"  # (what rootless Podman gives pasta: link-local, never routed)
MAX_NAMESERVERS = 3  # (the C library reads no more)
MAX_SIZE = 1 << 16
_KEPT = ("search", "domain", "options", "sortlist")


def read_host() -> str:
    """The host's resolver configuration (its text; empty if there is none, or it is not a
    regular file: a FIFO planted there would hang the launch)."""
    try:
        fd = os.open(HOST_CONF, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, MAX_SIZE).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def resolvers(text: str) -> list[str]:
    """The DNS servers `text` (a resolv.conf) names, as addresses."""
    found = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                found.append(str(ipaddress.ip_address(words[1].partition("%")[0])))
            except ValueError:
                continue
    return found


def on_loopback(found: list[str]) -> list[str]:
    return [a for a in found if ipaddress.ip_address(a).is_loopback]


def lost(text: str) -> list[str]:
    """The host's resolvers on its loopback when none can serve the sandbox (IPv6 ones only:
    pasta relays IPv4): DNS the host has and the sandbox would not. Empty otherwise."""
    return [] if sandbox_servers(text) else on_loopback(resolvers(text))


def sandbox_servers(text: str) -> list[str]:
    """The resolvers the sandbox's own file names (and its guard lets through on port 53):
    FORWARD for the host's first IPv4 one, wherever it is (pasta relays to it, and answers
    from it come back from FORWARD: asked directly, they would not match the question),
    then the others off the host's loopback."""
    found = resolvers(text)
    first = next((a for a in found if ipaddress.ip_address(a).version == 4), None)
    servers = [FORWARD] if first else []
    servers += [a for a in found if a != first and not ipaddress.ip_address(a).is_loopback]
    return servers[:MAX_NAMESERVERS]


def sandbox_conf(text: str) -> str:
    """The sandbox's /etc/resolv.conf for a host whose own is `text`."""
    lines = ["# the sandbox's own (Stockade, network any): the host's resolvers it can reach"]
    lines += [f"nameserver {address}" for address in sandbox_servers(text)]
    lines += [line.strip() for line in text.splitlines()
              if line.split()[:1] and line.split()[0] in _KEPT]
    return "\n".join(lines) + "\n"
