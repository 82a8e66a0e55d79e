"""Create sockets of address families a network namespace does not isolate (AF_VSOCK reaches
the hypervisor from any namespace) and of other kernel surface. Only created, never connected:
creating one is already the escape."""

import socket

from _common import attempt

for name, family, kind in (("AF_VSOCK", 40, socket.SOCK_STREAM),
                           ("AF_ALG", 38, socket.SOCK_SEQPACKET),
                           ("AF_PACKET", 17, socket.SOCK_DGRAM),
                           ("AF_BLUETOOTH", 31, socket.SOCK_STREAM),
                           ("AF_KEY", 15, socket.SOCK_RAW)):
    attempt(f"socket {name}", lambda f=family, k=kind: socket.socket(f, k).close())
