"""Hunt for variables of the parent's environment (the names given): in our own environment and
in every /proc/<pid>/environ we can read. The whole environment is printed too, so the host can
check that no secret value left it. Finding one is an escape."""

import os

from _common import ARGS, Refused, attempt, note


def environments():
    yield "os.environ", {k.encode(): v.encode() for k, v in os.environ.items()}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                pairs = [item.partition(b"=") for item in f.read().split(b"\0") if item]
        except OSError:
            continue
        yield f"/proc/{pid}/environ", {name: value for name, _, value in pairs}


def find(name):
    hits = [where for where, env in environments() if name.encode() in env]
    if not hits:
        raise Refused("ABSENT", "not found")
    return "in " + ", ".join(hits)


note("environment", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
for variable in ARGS:
    attempt(f"find ${variable}", lambda v=variable: find(v))
