"""Listen on a TCP port on every address and wait for the host to connect. Binding is refused
(Landlock restricts TCP bind; the landlock tier refuses the socket itself), and an accepted
connection from the host is the escape proper."""

import socket

from _common import ARGS, attempt

port, wait = int(ARGS[0]), float(ARGS[1])
server = None


def bind():
    global server
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))


def accept():
    server.listen()
    server.settimeout(wait)
    peer = server.accept()[1]
    return f"connection from {peer[0]}"


if attempt(f"bind 0.0.0.0:{port}", bind):
    attempt("accept a connection from the host", accept)
