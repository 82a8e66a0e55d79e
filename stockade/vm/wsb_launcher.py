"""How Windows Sandbox is started and stopped on this host: the `wsb` command-line tool where
present (Windows 11 24H2 and later: `wsb start --id ID --config XML`, `wsb stop --id ID`),
else `WindowsSandbox.exe FILE.wsb`, whose process is the sandbox's lifetime. Which one is a pure
function of what the injected lookups find on PATH and in System32 (`choose`); `here` looks
on this host."""

from __future__ import annotations

import ntpath
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from stockade.errors import UnavailableError, UnenforceableError

CLI, PROGRAM = "wsb", "exe"  # the kinds of launcher
_NAMES = {CLI: "wsb", PROGRAM: "WindowsSandbox"}
MAX_COMMAND_LINE = 32000  # CreateProcess takes 32 767 characters; keep a margin for quoting


@dataclass(frozen=True)
class Launcher:
    kind: str  # "wsb" (the CLI) or "exe" (WindowsSandbox.exe)
    program: str

    def start(self, sandbox_id: str, config: str, config_file: str) -> list[str]:
        """The argv that starts the sandbox: the CLI takes the configuration itself, the
        program the `.wsb` file that holds the same text."""
        if self.kind == PROGRAM:
            return [self.program, config_file]
        argv = [self.program, "start", "--id", sandbox_id, "--config", config]
        if sum(len(a) + 3 for a in argv) > MAX_COMMAND_LINE:
            raise UnenforceableError("filesystem", "the configuration is too long for the wsb "
                                     "command line: fewer roots are needed")
        return argv

    def stop(self, sandbox_id: str) -> list[str] | None:
        """The argv that stops the sandbox; None when ending the started process does."""
        return None if self.kind == PROGRAM else [self.program, "stop", "--id", sandbox_id]


def choose(which: Callable[[str], str | None], exists: Callable[[str], bool],
           system32: str) -> Launcher:
    """The CLI if found (PATH, then System32), else WindowsSandbox.exe; UnavailableError
    `windows_sandbox_unavailable` when neither is there."""
    for kind, name in _NAMES.items():
        found = which(name)
        if found is None and exists(candidate := ntpath.join(system32, name + ".exe")):
            found = candidate
        if found is not None:
            return Launcher(kind, found)
    raise UnavailableError("windows_sandbox_unavailable", "Windows Sandbox is not installed "
                           "(enable the optional feature Containers-DisposableClientVM)")


def here() -> Launcher:
    """The launcher this host has (`choose` over its PATH and System32)."""
    system32 = os.path.join(os.environ.get("SystemRoot", "C:\\Windows"), "System32")
    return choose(shutil.which, os.path.isfile, system32)
