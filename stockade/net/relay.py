"""Copy bytes both ways between a client and its upstream until both sides finish.

One thread per tunnel, waiting on both sockets at once: the idle timeout covers the tunnel as
a whole (a long download is not idle just because the client says nothing), half-closes are
passed on (EOF one way shuts down writing the other way), and a peer that stops reading stalls
a send for at most the idle timeout.
"""

from __future__ import annotations

import selectors
import socket

_CHUNK = 256 * 1024


def relay(client: socket.socket, upstream: socket.socket, idle_timeout: float) -> None:
    """Return when both directions reached EOF, on an error, or after `idle_timeout` seconds
    without traffic. The caller closes the sockets."""
    peer = {client: upstream, upstream: client}
    buffer = memoryview(bytearray(_CHUNK))
    for sock in peer:
        sock.settimeout(idle_timeout)
    with selectors.DefaultSelector() as selector:
        for sock in peer:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map():
            ready = selector.select(idle_timeout)
            if not ready:
                return
            for key, _ in ready:
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    size = source.recv_into(buffer)
                    if size:
                        peer[source].sendall(buffer[:size])
                        continue
                    selector.unregister(source)
                    peer[source].shutdown(socket.SHUT_WR)
                except OSError:
                    return
