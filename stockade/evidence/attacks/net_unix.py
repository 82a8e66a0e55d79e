"""Connect to the host's unix sockets: `abstract:NAME` and filesystem paths. The host's servers
answer, so any reply is an escape."""

import socket

from _common import ARGS, attempt


def exchange(address):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(address)
        s.sendall(b"ping")
        reply = s.recv(64)
        if not reply:
            raise ConnectionResetError(104, "closed without a reply")
        return f"reply {reply!r}"


for target in ARGS:
    address = "\0" + target[len("abstract:"):] if target.startswith("abstract:") else target
    attempt(f"connect {target}", lambda a=address: exchange(a))
