"""The guest's side of the Windows Sandbox rendezvous (see wsb_rendezvous): started by the
bootstrap as `guest.py PACKAGE_DIR RENDEZVOUS_DIR BOOT_ID HOST_ADDRESS PORT` once the firewall
lock and the mappings are verified, as the guest's administrator, before any command.

It takes the secret (reads it, deletes the file, checks that it is gone), listens on the
guest's address toward the host, publishes the rendezvous, accepts exactly one connection — from
the host's address; any other is closed — stops listening, answers the host's challenge, and
serves the session protocol on that connection with the agent.

The agent (stockade/session/agent.py) is POSIX-only today (prctl, pidfds, posix_spawn): on
Windows this entry publishes the refusal `windows_agent_unavailable` instead of listening, so a
boot fails typed and closed until the agent is ported. Elsewhere (the tests) it runs the real
agent on the socket."""

from __future__ import annotations

import os
import socket
import sys
import time

from stockade.vm import wsb_rendezvous as rz

ACCEPT_TIMEOUT = 120.0  # seconds the host has to connect once the rendezvous is published
ANSWER_TIMEOUT = 10.0  # seconds the host has to send its challenge
_DISCARD_PORT = 9  # only for finding the local address: a UDP connect sends nothing


class GuestRefusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def main(argv: list[str]) -> int:
    """Run the guest side; the exit status (0 once the session ended normally)."""
    if len(argv) != 4:
        print("usage: guest.py PACKAGE_DIR RENDEZVOUS_DIR BOOT_ID HOST_ADDRESS PORT",
              file=sys.stderr)
        return 2
    rendezvous, boot, host, port = argv
    try:
        secret = take_secret(rendezvous)
        if sys.platform == "win32":
            raise GuestRefusal("windows_agent_unavailable", "the session agent does not run "
                               "on Windows yet")
        listener = listen(host, int(port))
    except (GuestRefusal, OSError, ValueError) as exc:
        code = exc.code if isinstance(exc, GuestRefusal) else "guest_listen_failed"
        publish(rendezvous, rz.Refused(boot, code, str(exc)))
        return 3
    with listener:
        address, bound = listener.getsockname()[:2]
        publish(rendezvous, rz.Ready(boot, address, bound, rz.proof(secret, boot, address, bound)))
        conn = accept_host(listener, host, ACCEPT_TIMEOUT)
    if conn is None or not prove(conn, secret):
        return 4
    return serve(conn, secret)


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


def serve(conn: socket.socket, secret: bytes) -> int:
    """The session agent on `conn` (POSIX), set up as `stockade agent` sets itself up."""
    from stockade.linux.syscalls import prctl
    from stockade.session.agent import PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, Agent

    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    # Two descriptors: the agent registers reading and writing separately.
    return Agent(secret, conn.fileno(), os.dup(conn.fileno())).serve()
