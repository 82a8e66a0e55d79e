"""The guest's only way out in `allowlist` mode: QEMU's user-mode network with `restrict=on`
(the guest reaches neither the host nor anything beyond it) and one forwarding rule, which
hands each TCP connection the guest opens to GUEST_PROXY to a fresh `relay` process on the
host, connected to Stockade's proxy (stockade/net/proxy.py) on its private unix socket.

    guest client -> 10.0.2.100:3128 -> QEMU (guestfwd) -> relay -> proxy.sock -> Proxy

The relay runs as `python -I -S` with nothing but Stockade's package on its path; its stdin
and stdout are QEMU's end of the guest connection.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import threading

GUEST_ADDRESS = "10.0.2.15"  # the guest's address on QEMU's user-mode network (10.0.2.0/24)
GUEST_PROXY = ("10.0.2.100", 3128)  # where guest clients find the proxy (HTTP_PROXY etc.)
CHUNK = 1 << 16
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from stockade.vm.egress import relay; relay(sys.argv[2])")


def netdev(proxy_socket: str) -> str:
    """QEMU's -netdev option: user-mode networking that reaches only the forwarding rule."""
    command = shlex.join([os.path.realpath(sys.executable), "-I", "-S", "-c", _BOOT,
                          _PACKAGE_PARENT, proxy_socket])
    host, port = GUEST_PROXY
    return (f"user,id=egress,restrict=on,ipv6=off,net=10.0.2.0/24,"
            f"guestfwd=tcp:{host}:{port}-cmd:{command.replace(',', ',,')}")


def relay(proxy_socket: str) -> None:
    """Copy between the guest connection and the proxy, both ways, until each side has
    finished; an end (EOF) one way is passed on as a half-close that way, so that a client
    reading to the end of a response sees the end when the server closes."""
    # QEMU hands us the guest connection as one socket on stdin, stdout and stderr: stderr
    # goes nowhere, so that nothing of ours (a traceback naming host paths) reaches the guest.
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    os.close(quiet)
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.connect(proxy_socket)

    def to_proxy() -> None:
        with contextlib.suppress(OSError):  # the proxy ended the connection
            while data := os.read(0, CHUNK):
                upstream.sendall(data)
            upstream.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=to_proxy, daemon=True)
    sender.start()
    with contextlib.suppress(OSError):  # the guest ended the connection
        while data := upstream.recv(CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
    _end_writing(1)
    sender.join()


def _end_writing(fd: int) -> None:
    """Half-close the guest connection: a shutdown, since closing `fd` alone would leave the
    socket open through stdin and stderr (a pipe, as in tests, is simply closed)."""
    duplicate = os.dup(fd)
    try:
        guest = socket.socket(fileno=duplicate)
    except OSError:  # not a socket
        os.close(duplicate)
        os.close(fd)
        return
    with guest, contextlib.suppress(OSError):
        guest.shutdown(socket.SHUT_WR)
