"""Plant Stockade's servers for the host's clients (G1): make the directory STATE (argv: STATE
DONE) where a host client looks for its state directory, listen on its cli.sock and daemon.sock
as `stockade daemon` would, and hear what the host's `stockade run` and `stockade session`
send until the file DONE appears (60 s at most). Any byte heard is an escape: a run's request
carries its argv, working directory, whole environment and standard streams. The host clients
must check who listens first, and send nothing to a process inside a sandbox."""

import json
import os
import select
import socket
import time

from _common import ARGS, CannotTry, Refused, attempt, note

STATE, DONE = ARGS[0], ARGS[1]
NAMES = ("cli.sock", "daemon.sock")
# What a server answers once it has a request: an exit status, a session list (so that a
# client that trusted it believes its command ran).
ANSWERS = {"cli.sock": b"0\n", "daemon.sock": json.dumps({"event": "sessions",
                                                          "sessions": []}).encode() + b"\n"}


def plant():
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    for name in NAMES:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(STATE, name))
        listener.listen(8)
        listeners[listener] = name


def again(exc):
    raise exc


def attempts(action):
    for name in NAMES:
        attempt(f"hear the host's client on a planted {name}", lambda n=name: action(n))


listeners = {}
try:
    plant()
except OSError as exc:  # (a sandbox that cannot even listen hears nothing)
    attempts(lambda name, e=exc: again(e))
    raise SystemExit(0) from None
note("planted", "listening")
heard = {name: [0, 0] for name in NAMES}  # name -> [connections, bytes]
talking = {}  # connection -> name
deadline = time.monotonic() + 60
while not os.path.exists(DONE) and time.monotonic() < deadline:
    for ready in select.select([*listeners, *talking], [], [], 0.1)[0]:
        if ready in listeners:
            conn, _ = ready.accept()
            talking[conn] = listeners[ready]
            heard[listeners[ready]][0] += 1
            continue
        name = talking[ready]
        try:
            data = ready.recv(1 << 20)
        except OSError:
            data = b""
        if data:
            heard[name][1] += len(data)
            try:
                ready.sendall(ANSWERS[name])
            except OSError:
                pass
        else:
            del talking[ready]
            ready.close()


def judged(name):
    connections, received = heard[name]
    if not connections:
        raise CannotTry("no host client connected")
    if not received:
        raise Refused("NOTHING_SENT", "the host client sent nothing")
    return f"heard {received} bytes from {connections} connection(s)"


attempts(judged)
