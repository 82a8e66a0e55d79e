"""`stockade demo`: untrusted code tries forbidden things inside a real sandbox.

A small Python script runs through `stockade.run`, first under the `read-only` preset, then under
`workspace-write` (for a repository's protected hooks and config beside permitted writes to
the workspace and to `.git` itself, which git needs), then under `networked-build`
(a package-registry allowlist enforced by Stockade's proxy; only denied destinations are tried,
so nothing leaves this machine). It prints one line per attempt,
with the error the child itself observed: `attempt → DENIED (EACCES: ...)` or `→ ALLOWED`. The
parent supplies the bait: a fake `DEMO_SECRET` in its environment, a TCP listener on 127.0.0.1,
a temporary workspace with a `.git` directory. Exit 0 only if every verdict is the expected one.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import stockade

# Runs inside the sandbox. argv[1]: a JSON list of [label, action, argument].
CHILD = r"""
import ctypes, errno, json, os, socket, sys, urllib.error, urllib.request

def write(path):
    with open(path, "w") as f:
        f.write("written by the demo\n")

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def connect(port):
    socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()

def connect_to(address):
    host, port = address.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=3).close()

def unshare_user(_):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))

def fetch(url):
    urllib.request.urlopen(url, timeout=10).close()

def getenv(name):
    if name not in os.environ:
        raise LookupError("not in the environment")

for label, action, argument in json.loads(sys.argv[1]):
    try:
        globals()[action](argument)
        verdict = "ALLOWED"
    except urllib.error.HTTPError as exc:
        verdict = f"DENIED (HTTP {exc.code} from Stockade's proxy)"
    except OSError as exc:
        verdict = f"DENIED ({errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror})"
    except LookupError as exc:
        verdict = f"DENIED ({exc})"
    print(f"  {label:<40} → {verdict}", flush=True)
"""

SECRET = "DEMO_SECRET"


def main() -> int:
    """Run the demo, print its report; 0 if every attempt got the expected verdict, else 1."""
    tag = secrets.token_hex(4)
    outside = [Path("/etc") / f"stockade-demo-{tag}", Path.home() / f"stockade-demo-{tag}"]
    with tempfile.TemporaryDirectory(prefix="stockade-demo-") as workspace, \
            _listener() as port, _fake_secret():
        (Path(workspace) / ".git" / "hooks").mkdir(parents=True)
        (Path(workspace) / ".git" / "config").write_text("[core]\n")
        print(f"stockade demo: untrusted code in a sandbox, workspace {workspace}")
        runs = _plan(workspace, port, outside)
        try:
            failures = sum(_attempts(name, workspace, attempts) for name, attempts in runs.items())
        finally:
            for path in outside:  # only there if the sandbox leaked
                with suppress(OSError):
                    path.unlink()
    total = sum(len(attempts) for attempts in runs.values())
    verdict = "the sandbox held" if not failures else f"{failures} NOT as expected"
    print(f"summary: {total - failures} of {total} attempts as expected: {verdict}")
    return 0 if not failures else 1


def _plan(workspace: str, port: int, outside: list[Path]) -> dict[str, list[tuple]]:
    """Preset -> attempts, each (label, action, argument, expected verdict)."""
    return {
        "read-only": [
            ("read /etc/shadow", "read", "/etc/shadow", "DENIED"),
            (f"write {outside[0]}", "write", str(outside[0]), "DENIED"),
            (f"write ~/{outside[1].name}", "write", str(outside[1]), "DENIED"),
            (f"read ${SECRET} (set in the parent)", "getenv", SECRET, "DENIED"),
            (f"connect to the host's 127.0.0.1:{port}", "connect", port, "DENIED"),
            ("create a user namespace", "unshare_user", None, "DENIED"),
        ],
        "workspace-write": [
            ("write workspace/.git/config", "write", f"{workspace}/.git/config", "DENIED"),
            ("write workspace/.git/hooks/pre-commit", "write",
             f"{workspace}/.git/hooks/pre-commit", "DENIED"),
            ("write workspace/.git/index (git works)", "write", f"{workspace}/.git/index",
             "ALLOWED"),
            ("write workspace/notes.txt", "write", f"{workspace}/notes.txt", "ALLOWED"),
        ],
        "networked-build": [
            ("fetch http://example.com/ (not listed)", "fetch", "http://example.com/", "DENIED"),
            ("fetch cloud metadata 169.254.169.254", "fetch", "http://169.254.169.254/",
             "DENIED"),
            ("connect to 192.0.2.1:443, bypassing it", "connect_to", "192.0.2.1:443", "DENIED"),
        ],
    }


def _attempts(preset: str, workspace: str, attempts: list[tuple]) -> int:
    """Run `attempts` in one sandbox and print its lines; how many were not as expected."""
    print(f"under preset {preset}:")
    script = json.dumps([attempt[:3] for attempt in attempts])
    result = stockade.run(["python3", "-I", "-X", "utf8", "-c", CHILD, script],
                          preset=preset, workspace=workspace, timeout=30)
    lines = result.stdout.decode("utf-8", "replace").splitlines()[:len(attempts)]
    failures = len(attempts) - len(lines)  # a line missing is a failure
    for line, (*_, expected) in zip(lines, attempts, strict=False):
        as_expected = line.rpartition("→ ")[2].startswith(expected)
        failures += not as_expected
        print(line if as_expected else f"{line}   <-- expected {expected}")
    if failures or result.exit_status != 0:
        sys.stderr.write(result.stderr.decode("utf-8", "replace"))
        print(f"  (the script ended with status {result.exit_status})")
    return failures


@contextmanager
def _listener() -> Iterator[int]:
    """A TCP listener on the host's loopback; yields its port."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@contextmanager
def _fake_secret() -> Iterator[None]:
    """A fake secret in this process's environment, as an agent's credentials would be."""
    previous = os.environ.get(SECRET)
    os.environ[SECRET] = "fake-secret-" + secrets.token_hex(8)
    try:
        yield
    finally:
        if previous is None:
            del os.environ[SECRET]
        else:
            os.environ[SECRET] = previous
