"""Passing file descriptors between processes over unix sockets (SCM_RIGHTS)."""

from __future__ import annotations

import array
import os
import socket


def send_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def recv_fds(sock: socket.socket, count: int, size: int = 64) -> tuple[bytes, list[int]]:
    """(message of up to `size` bytes, descriptors); an empty message means the peer closed
    its end."""
    data, ancdata, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(count * 4))
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
