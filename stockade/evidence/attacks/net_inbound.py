"""Network any: be reached by peers the sandbox never contacted. Binds a UDP port of its choice
(outside the ephemeral range, where services listen), sends one datagram from it to a peer
(the knocker, servers.Knocker), which answers with the host port the datagram left from; that
port is bound here too, so whatever the host relays to it finds a socket. Then it listens while
the peer knocks at that host port from the host's loopback and its own address. Arguments:
PEER PORT CHOSEN SECONDS."""

import select
import socket
import sys
import time

from _common import ARGS, Refused, attempt, note

peer, peer_port, chosen, seconds = ARGS[0], int(ARGS[1]), int(ARGS[2]), float(ARGS[3])
own = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
own.bind(("0.0.0.0", chosen))
own.settimeout(5)
own.sendto(b"which port?", (peer, peer_port))
try:
    mapped = int(own.recvfrom(100)[0].decode().rpartition(":")[2])
except (OSError, ValueError) as exc:  # (the peer must answer: else nothing was tried)
    print(f"contact the peer: error no answer ({exc})", flush=True)
    sys.exit(0)
note("host port", str(mapped))
listeners = [own]
if mapped != chosen:
    listeners.append(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    try:
        listeners[-1].bind(("0.0.0.0", mapped))
    except OSError as exc:
        note(f"bind {mapped}", str(exc))


def host_port():
    if mapped == chosen:
        return f"the host bound port {chosen}, the sandbox's choice"
    raise Refused("REMAPPED", f"the host port was {mapped}")


def unsolicited():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for ready in select.select(listeners, [], [], 0.2)[0]:
            data, sender = ready.recvfrom(200)
            if data.startswith(b"unsolicited"):
                return f"{data.decode(errors='replace')} ({sender[0]}:{sender[1]})"
    raise Refused("NO_DATAGRAM")


attempt(f"take host UDP port {chosen}", host_port)
attempt("receive datagrams from senders never contacted", unsolicited)
