"""Talk to servers outside the sandbox. Each argument is PROTO:HOST:PORT, PROTO one of tcp, udp,
dns-udp, dns-tcp (a DNS query); every server there answers, so any reply is an escape."""

import socket
import struct

from _common import ARGS, attempt

# A standard query for evidence.invalid, type A.
QUERY = (struct.pack(">HHHHHH", 0x5EED, 0x0100, 1, 0, 0, 0)
         + b"\x08evidence\x07invalid\x00" + struct.pack(">HH", 1, 1))


def exchange(proto, host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    stream = proto in ("tcp", "dns-tcp")
    with socket.socket(family, socket.SOCK_STREAM if stream else socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect((host, port))
        payload = QUERY if proto.startswith("dns") else b"ping"
        s.sendall(struct.pack(">H", len(payload)) + payload if proto == "dns-tcp" else payload)
        reply = s.recv(512)
        if not reply:
            raise ConnectionResetError(104, "closed without a reply")
        return f"reply {reply[:16]!r}"


for target in ARGS:
    proto, rest = target.split(":", 1)
    host, _, port = rest.rpartition(":")
    address = host.strip("[]")
    attempt(f"{proto} {host}:{port}", lambda p=proto, h=address, n=int(port): exchange(p, h, n))
