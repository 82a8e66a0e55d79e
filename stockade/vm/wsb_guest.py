"""The guest's side of a Windows Sandbox boot (see wsb_rendezvous): started by the bootstrap, as
the guest's administrator, once the firewall lock and the mappings are verified and the command
user exists, as

    guest.py PACKAGE_DIR RENDEZVOUS_DIR BOOT_ID PIDS spool
    guest.py PACKAGE_DIR RENDEZVOUS_DIR BOOT_ID PIDS tcp HOST_ADDRESS PORT

with the command user's password as the first line of its stdin (PIDS: the Job's process
limit per command, or `-`).

It takes the secret (reads it, deletes the file, checks that it is gone); over TCP it listens
on the guest's address toward the host; it publishes the rendezvous; over TCP it accepts
exactly one connection — from the host's address; any other is closed — stops listening and
answers the host's challenge; then it serves the session protocol (wsb_agent) on that
connection or on the spool, starting each command as the standard user in a Job of its own
(wsb_winproc). Anything that fails before the rendezvous publishes a refusal with a stable code
instead.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TextIO

from stockade.errors import StockadeError
from stockade.vm import wsb_rendezvous as rz
from stockade.vm.wsb_agent import Agent, SocketTransport, Spawn, Transport
from stockade.vm.wsb_spool import SpoolTransport

ACCEPT_TIMEOUT = 120.0  # seconds the host has to connect once the rendezvous is published
ANSWER_TIMEOUT = 10.0  # seconds the host has to send its challenge
COMMAND_USER = "stockade-cmd"  # the standard guest user the bootstrap creates
MAX_PASSWORD = 256
_DISCARD_PORT = 9  # only for finding the local address: a UDP connect sends nothing
# (password, the Job's process limit or None) -> how commands are started
Spawner = Callable[[str, int | None], Spawn]


class GuestRefusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def main(argv: list[str], spawner: Spawner | None = None, stdin: TextIO | None = None) -> int:
    """Run the guest side; the exit status (0 once the session ended normally). `spawner`
    replaces wsb_winproc's (tests)."""
    if len(argv) not in (4, 6) or argv[3] not in (rz.SPOOL, rz.TCP) or \
            (argv[3] == rz.TCP) != (len(argv) == 6):
        print("usage: guest.py PACKAGE_DIR RENDEZVOUS_DIR BOOT_ID PIDS (spool | tcp "
              "HOST_ADDRESS PORT)", file=sys.stderr)
        return 2
    rendezvous, boot, pids, transport = argv[:4]
    host = argv[4] if transport == rz.TCP else ""
    listener = None
    try:
        password = read_password(stdin or sys.stdin)
        secret = take_secret(rendezvous)
        spawn = (spawner or _command_user)(password, None if pids == "-" else int(pids))
        if transport == rz.TCP:
            listener = listen(host, int(argv[5]))
    except (GuestRefusal, StockadeError, OSError, ValueError) as exc:
        code = exc.code if isinstance(exc, GuestRefusal | StockadeError) else \
            "guest_start_failed"
        publish(rendezvous, rz.Refused(boot, code, str(exc)))
        return 3
    if listener is None:
        publish(rendezvous, rz.Ready(boot, rz.SPOOL, rz.proof(secret, boot, rz.SPOOL)))
        channel: Transport = SpoolTransport(rendezvous, secret)
    else:
        with listener:
            address, bound = listener.getsockname()[:2]
            publish(rendezvous, rz.Ready(boot, rz.TCP, rz.proof(
                secret, boot, rz.TCP, address, bound, host), address, bound, host))
            conn = accept_host(listener, host, ACCEPT_TIMEOUT)
        if conn is None or not prove(conn, secret):
            return 4
        channel = SocketTransport(conn)
    return Agent(secret, channel, spawn).serve()


def read_password(stdin: TextIO) -> str:
    """The command user's password: the first line the bootstrap wrote."""
    password = stdin.readline(MAX_PASSWORD + 2).rstrip("\r\n")
    if not password or len(password) > MAX_PASSWORD:
        raise GuestRefusal("command_user_unavailable", "no password for the command user on "
                           "stdin")
    return password


def _command_user(password: str, pids: int | None) -> Spawn:
    from stockade.vm import wsb_winproc  # (Windows only: it binds Win32 functions)

    return wsb_winproc.spawner(COMMAND_USER, password, pids)


def take_secret(rendezvous: str) -> bytes:
    """The boot's secret; its file is gone when this returns."""
    path = os.path.join(rendezvous, rz.SECRET_FILE)
    try:
        with open(path, "rb") as f:
            secret = f.read(rz.SECRET_SIZE + 1)
        os.remove(path)
    except OSError as exc:
        raise GuestRefusal("secret_unavailable", f"the boot secret cannot be taken "
                           f"({exc.strerror})") from None
    if os.path.lexists(path):
        raise GuestRefusal("secret_unavailable", "the boot secret's file is still there")
    if len(secret) != rz.SECRET_SIZE:
        raise GuestRefusal("secret_unavailable", "the boot secret has the wrong size")
    return secret


def listen(host: str, port: int) -> socket.socket:
    """A listener on this guest's address toward `host` (port 0: any free port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, _DISCARD_PORT))
        address = probe.getsockname()[0]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((address, port))
        listener.listen(1)
    except OSError:
        listener.close()
        raise
    return listener


def publish(rendezvous: str, record: rz.Ready | rz.Refused) -> None:
    """Write the rendezvous atomically: the host never reads half of it."""
    temporary = os.path.join(rendezvous, rz.RENDEZVOUS_TEMP)
    with open(temporary, "wb") as f:
        f.write(rz.encode(record))
    os.replace(temporary, os.path.join(rendezvous, rz.RENDEZVOUS_FILE))


def accept_host(listener: socket.socket, host: str, timeout: float) -> socket.socket | None:
    """The first connection from `host` within `timeout` seconds (others are closed)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        listener.settimeout(left)
        try:
            conn, peer = listener.accept()
        except TimeoutError:
            return None
        if peer[0] == host:
            return conn
        conn.close()
    return None


def prove(conn: socket.socket, secret: bytes) -> bool:
    """Answer the host's challenge; False (connection closed) if none came in time."""
    conn.settimeout(ANSWER_TIMEOUT)
    challenge = b""
    try:
        while len(challenge) < rz.CHALLENGE_SIZE:
            chunk = conn.recv(rz.CHALLENGE_SIZE - len(challenge))
            if not chunk:
                break
            challenge += chunk
        if len(challenge) == rz.CHALLENGE_SIZE:
            conn.sendall(rz.answer(secret, challenge))
            conn.settimeout(None)
            return True
    except OSError:
        pass
    conn.close()
    return False
