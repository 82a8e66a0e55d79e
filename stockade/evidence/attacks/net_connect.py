"""Talk to servers outside the sandbox. Each argument is PROTO:HOST:PORT, PROTO one of tcp, udp,
dns-udp, dns-tcp (a DNS query), HOST an IPv6 address in brackets, with a zone (%eth0) if it is
link-local; every server there answers, so any reply is an escape."""

import socket
import struct
import time

from _common import ARGS, CannotTry, attempt

TENTATIVE = 0x40  # /proc/net/if_inet6's flag: duplicate address detection still running

# A standard query for evidence.invalid, type A.
QUERY = (struct.pack(">HHHHHH", 0x5EED, 0x0100, 1, 0, 0, 0)
         + b"\x08evidence\x07invalid\x00" + struct.pack(">HH", 1, 1))


def exchange(proto, host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    stream = proto in ("tcp", "dns-tcp")
    address, _, zone = host.partition("%")
    if zone:
        link_local_ready(zone)
    with socket.socket(family, socket.SOCK_STREAM if stream else socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        # (a zone as the scope id: Python drops it from the text)
        s.connect((address, port, 0, socket.if_nametoindex(zone)) if zone else (address, port))
        payload = QUERY if proto.startswith("dns") else b"ping"
        s.sendall(struct.pack(">H", len(payload)) + payload if proto == "dns-tcp" else payload)
        reply = s.recv(512)
        if not reply:
            raise ConnectionResetError(104, "closed without a reply")
        return f"reply {reply[:16]!r}"


def link_local_ready(zone, seconds=5.0):
    """Wait until the interface `zone` has a link-local address past duplicate detection (a
    fresh sandbox's is seconds old): before, the connection leaves from another address, and
    no answer reaches it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open("/proc/net/if_inet6") as table:
            if any(words[5] == zone and words[0].startswith("fe80")
                   and not int(words[4], 16) & TENTATIVE for words in map(str.split, table)):
                return
        time.sleep(0.05)
    raise CannotTry(f"{zone} has no link-local address past duplicate detection")


for target in ARGS:
    proto, rest = target.split(":", 1)
    host, _, port = rest.rpartition(":")
    address = host.strip("[]")
    attempt(f"{proto} {host}:{port}", lambda p=proto, h=address, n=int(port): exchange(p, h, n))
