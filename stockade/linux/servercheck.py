"""A client's check of the Stockade server it is about to talk to, before it sends a byte.

A sandbox can make a directory where a host client looks for the state directory (a write root
that holds its parent: the command renames the real one away) and listen there on cli.sock or
daemon.sock; whatever a client sends then reaches the sandbox (a run's argv, working directory,
whole environment and standard streams). So the clients (`stockade run` through the CLI
server, stockade/program.py; the session clients, stockade/session/client.py) connect only
through `connect`:

- the socket's directory is opened without following a symbolic link and must be owned by
  this user and writable by no one else; the connection is made through that open directory
  (`/proc/self/fd/N/NAME`), so the directory checked is the one connected in, whatever is
  renamed or replaced meanwhile;
- the process that listens, as the kernel tells it (SO_PEERCRED and a pidfd: its `/proc` read
  here, stockade/linux/peer.py), must have this process's own context: the same user,
  namespaces and root, capabilities, no_new_privs, seccomp state and LSM label. No process
  inside a Stockade sandbox has (each has namespaces of its own, or the landlock tier's
  no_new_privs and seccomp filter).

The server checks its client the same way (peer.py); neither trusts what the other says.
Every connection a Stockade client makes to a Stockade socket goes through here, the servers'
own "is one already listening?" at start (`answers`) included: a planted socket there is
neither taken for a live server (it kept the real daemon from starting) nor sent anything.
"""

from __future__ import annotations

import _socket
import os

from stockade.lifecycle import lease
from stockade.linux import peer


class ServerUntrusted(Exception):
    """What listens is not a Stockade server of this user's own context, or its directory is
    not this user's alone; `.why` says which (never a value of the other side)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def answers(path: str) -> bool:
    """Whether a server of this user's own context listens at `path` (connected to, checked,
    and sent nothing); False when nothing listens there; ServerUntrusted when something else
    does."""
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connect(probe, path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def connect(conn: _socket.socket, path: str) -> None:
    """Connect `conn` (an unconnected AF_UNIX stream socket) to the server listening at `path`,
    and check it (see the module docstring). OSError when nothing listens there (or it cannot
    be reached); ServerUntrusted when something does but is not to be talked to."""
    directory, name = os.path.split(os.path.abspath(path))
    pinned = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        own = peer.own_context()  # (read before connecting: it depends on us alone)
        conn.connect(f"/proc/self/fd/{pinned}/{name}")
        connected = peer.boottime()
        info = os.fstat(pinned)
        why = lease.distrust(info)
        if why is not None:
            raise ServerUntrusted(f"its directory {directory} {why}")
        try:
            peer.check_peer(conn, own, accepted=connected)
        except peer.PeerRefused as exc:
            raise ServerUntrusted(exc.why) from None
    finally:
        os.close(pinned)
