"""SOCKS5 (RFC 1928), the part a sandboxed client needs: no authentication, CONNECT, and
destinations by name (remote DNS, `socks5h://`), IPv4 or IPv6. BIND and UDP ASSOCIATE are
refused with "command not supported": the proxy carries no UDP.
"""

from __future__ import annotations

import ipaddress
import socket

from stockade.net.stream import Closed, Stream

CONNECT = 1
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
HOST_UNREACHABLE = 0x04
REFUSED = 0x05
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_NOT_SUPPORTED = 0x08


class Refused(Exception):
    """The request is malformed; `code` is the reply to send before closing."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def read_request(stream: Stream, sock: socket.socket) -> tuple[int, str, int]:
    """Negotiate "no authentication" and read the request: (command, host, port).

    A name is decoded as Latin-1 so any bytes reach the host check, which refuses them.
    """
    version, count = stream.read(2)
    if version != 5:
        raise Closed("not SOCKS5")
    if 0 not in stream.read(count):
        sock.sendall(b"\x05\xff")
        raise Closed("no acceptable authentication method")
    sock.sendall(b"\x05\x00")
    version, command, _, kind = stream.read(4)
    if version != 5:
        raise Refused(GENERAL_FAILURE)
    if kind == 1:
        host = str(ipaddress.IPv4Address(stream.read(4)))
    elif kind == 3:
        host = stream.read(stream.read(1)[0]).decode("latin-1")
    elif kind == 4:
        host = str(ipaddress.IPv6Address(stream.read(16)))
    else:
        raise Refused(ADDRESS_NOT_SUPPORTED)
    return command, host, int.from_bytes(stream.read(2), "big")


def reply(code: int) -> bytes:
    """A reply with a zero bound address: the client has no use for the host's own address."""
    return bytes((5, code, 0, 1, 0, 0, 0, 0, 0, 0))
