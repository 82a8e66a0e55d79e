"""Ask Stockade's own servers to act outside the sandbox: `daemon:SOCKET` (a warm session
whose policy writes OUTSIDE, and the list of sessions), `cli:SOCKET` (a run that writes
OUTSIDE, and the `agent` command line). Being served is an escape; the servers must refuse a
peer inside a sandbox (`peer_refused`, or the CLI server's "run it yourself")."""

import json
import os
import socket
import struct

from _common import ARGS, Refused, attempt

OUTSIDE = ARGS[0]


def ask_daemon(path, request):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(path)
        s.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n") and (chunk := s.recv(65536)):
            answer += chunk
    reply = json.loads(answer)
    if reply.get("event") == "error" and reply.get("code") == "peer_refused":
        raise Refused("PEER_REFUSED")
    return f"served: {reply.get('event')}"


def ask_cli(path, argv):
    # The program facts the server serves (the host wrote them beside its socket: the attack
    # knows what any program on the host could know), so that only its peer check refuses.
    with open(os.path.join(os.path.dirname(path), "cli.facts")) as facts:
        words = [word.encode() for word in ["--program-facts", *json.load(facts), *argv]]
    fields = [str(len(words)).encode(), *words, b"/", b"22", b"PATH=/usr/bin:/bin"]
    body = b"".join(field + b"\0" for field in fields)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(path)
        try:
            s.sendmsg([struct.pack("<I", len(body)) + body],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        except BrokenPipeError:
            pass
        answer = b""
        while not answer.endswith(b"\n") and (chunk := s.recv(64)):
            answer += chunk
    if answer == b"here\n":
        raise Refused("NOT_SERVED", "not served (run it yourself)")
    return f"served: {answer!r}"


escape = ["sh", "-c", f"echo escaped > {OUTSIDE}/escaped"]
for target in ARGS[1:]:
    kind, _, path = target.partition(":")
    if kind == "daemon":
        attempt("daemon session writing outside", lambda p=path: ask_daemon(p, {
            "op": "exec", "session": "evidence", "argv": escape, "workspace": OUTSIDE,
            "policy": {"version": 1, "preset": "workspace-write"}}))
        attempt("daemon list of sessions", lambda p=path: ask_daemon(p, {"op": "list"}))
    else:
        attempt("cli-server run writing outside", lambda p=path: ask_cli(p, [
            "run", "--preset", "workspace-write", "--workspace", OUTSIDE, "--", *escape]))
