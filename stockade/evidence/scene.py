"""The host side of one row: a private directory tree, the launch's marker, the bait, and the
watches that say afterwards whether anything outside the sandbox changed.

Layout of a scene (a fresh directory per row): `ws/` is the workspace (`{workspace}`), `home/`
is what `{home}` means, `outside/` is never granted and holds `secret`, a file whose random
content must never reach the child's output.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from stockade.evidence.watch import Watch
from stockade.lifecycle import homes

if TYPE_CHECKING:
    from stockade.net.gate import Dialer

ATTACKS = Path(__file__).resolve().parent / "attacks"
W = TypeVar("W", bound=Watch)


class NotRunnable(Exception):
    """This host cannot set the row up; the message says why."""


class Scene:
    def __init__(self, base: Path, row_id: str, tag: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=row_id + "-", dir=base))
        self.marker = f"stockade-evidence-{tag}-{row_id}"
        self.ws, self.home, self.outside = (self.root / name for name in ("ws", "home", "outside"))
        for directory in (self.ws, self.home, self.outside):
            directory.mkdir()
        self.secret = "evidence-secret-" + secrets.token_hex(12)
        (self.outside / "secret").write_text(self.secret)
        # Placeholders for the attack's arguments ({ws}, {secret_file}, ...); setups add more.
        self.values: dict[str, str] = {
            "root": str(self.root), "ws": str(self.ws), "home": str(self.home),
            "outside": str(self.outside), "secret_file": str(self.outside / "secret"),
            "host_pid": str(os.getpid()),
            # Whether the host user is root: some privileges exist only for root anywhere.
            "host_user": "root" if os.getuid() == 0 else "user",
        }
        self.read_roots: list[str] = []      # granted read-only, besides the preset's
        self.host_env = {**os.environ, "HOME": str(self.home)}
        # The seal key's directory, beside which launches keep the private homes (a place
        # of the scene's, as statedir.key_dir is the user's: the user's own homes are never
        # the matrix's, and a home there would show its path in the view; a setup may name
        # another)
        self.key_dir = str(self.root / "keys" / "stockade")
        # The home the password database names (the denied paths of the home are denied there
        # too, whatever HOME says): the scene's, as the user's is never the matrix's; a setup
        # may name another.
        self.passwd_home = str(self.home)
        self.secrets = [self.secret]         # must never appear in the child's output
        self.stdin: str | None = None        # "inherit" to hand the child our stdin
        self.cancel: threading.Event | None = None
        self.watches: list[Watch] = []
        # The allowlist proxy's stand-in DNS and connections, if the row needs them (see
        # setups.stand_in_network): (resolver, dialer).
        self.stand_ins: tuple[Callable[[str], list[str]], Dialer] | None = None
        # The CA file the proxy verifies intercepted hosts with (setups.credential_hosts:
        # the scene's servers are under a test CA of its own), or None: the system's.
        self.upstream_ca: str | None = None

    def watch(self, watch: W) -> W:
        self.watches.append(watch)
        return watch

    def plant(self, relative: str, content: str = "") -> Path:
        """A file below the scene root, with its parents; returns its path."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return path

    def plant_secret(self, relative: str) -> Path:
        """A file holding a fresh secret that must never reach the child's output."""
        value = "evidence-secret-" + secrets.token_hex(12)
        self.secrets.append(value)
        return self.plant(relative, value)

    def expand(self, argument: str) -> str:
        return argument.format_map(self.values)

    def close(self) -> None:
        for watch in reversed(self.watches):
            watch.close()
        # the private homes (filesystem.home) Stockade made for the scene's workspaces, which
        # are kept beside the seal key's directory, outside the scene: a matrix run made ~100
        soak = self.root / "soak"
        for workspace in [self.ws, self.outside, self.home,
                          *(sorted(soak.iterdir()) if soak.is_dir() else [])]:
            homes.discard(str(workspace), self.key_dir)
        shutil.rmtree(self.root, ignore_errors=True)
