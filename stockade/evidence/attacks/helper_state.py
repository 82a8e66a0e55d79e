"""Reach Stockade's own state directory (a daemon serving from it): `list:DIR`, `read:FILE`,
`connect:SOCKET`. Listing, reading or connecting is an escape (the ledger's records and the
daemon's sockets are a way around every layer)."""

import os
import socket

from _common import ARGS, attempt


def connect(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        return "connected"


for target in ARGS:
    kind, _, path = target.partition(":")
    action = {"list": lambda p=path: f"{len(os.listdir(p))} entries",
              "read": lambda p=path: f"{len(open(p, 'rb').read())} bytes",
              "connect": lambda p=path: connect(p)}[kind]
    attempt(f"{kind} {path}", action)
