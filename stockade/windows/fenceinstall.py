"""Installing and removing the fence service (`stockade fence install` / `uninstall`), as an
administrator.

The service runs as LocalSystem the code of the interpreter that installs it, so that code must
be an administrator's: installing is refused (`fence_install_unsafe`) from a virtual
environment, or when the interpreter's tree (`sys.base_prefix`, everything below it), the
directory holding the `stockade` package, or the service's state directories can be changed
by anyone but SYSTEM, Administrators and TrustedInstaller (an allow entry giving any right to
write, delete, change the DACL or the owner, or an owner outside them: `writable_by_others`),
or when a directory above the interpreter lets anyone else rename or delete what is below it.
python.org's installer "for all users" (C:\\Program Files\\Python3x) passes; an interpreter
in a directory made below C:\\ (whose entries give Authenticated Users modify on what is made
there) does not until its DACL is reset (scripts/windows_ci.py secure-interpreter).

What it runs are data (`install_commands`, `uninstall_commands`): the state directories
`STATES` (%ProgramData%\\Stockade and its `fence`, where the service keeps its ledger) made and
their DACLs reset to SYSTEM and Administrators alone with `icacls`, then `sc.exe create` (start
automatic, LocalSystem, binPath `"<python>" -I -m stockade.windows.fenceservice`: isolated
mode, no user site or PYTHON* variable), a restart on failure, `sc.exe start`; uninstalling is
`sc.exe stop` (the service takes every fence back as it stops) and `sc.exe delete`. The state
directory is kept: a record left there (a sandbox that outlived the stop) is the next
install's reconcile to take back.
"""

from __future__ import annotations

import ntpath
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator

from stockade.errors import SetupError
from stockade.windows import acl, fenceclient
from stockade.windows import constants as c
from stockade.windows.admission import inside

SERVICE_NAME = "StockadeFence"
_DATA = os.environ.get("ProgramData", "C:\\ProgramData")
STATES = (ntpath.join(_DATA, "Stockade"), ntpath.join(_DATA, "Stockade", "fence"))
STATE = STATES[-1]
SYSTEM, ADMINISTRATORS = "S-1-5-18", "S-1-5-32-544"
TRUSTED_INSTALLER = "S-1-5-80-956008885-3418522649-1831038044-1853292631-2271478464"
TRUSTED = frozenset({SYSTEM, ADMINISTRATORS, TRUSTED_INSTALLER})
FILE_WRITE_DATA, FILE_APPEND_DATA, FILE_WRITE_EA, FILE_DELETE_CHILD = 0x2, 0x4, 0x10, 0x40
WRITE_OWNER = 0x00080000
# What lets a trustee change a file or directory, or what runs from it.
WRITE_RIGHTS = (FILE_WRITE_DATA | FILE_APPEND_DATA | FILE_WRITE_EA | FILE_DELETE_CHILD
                | c.FILE_WRITE_ATTRIBUTES | c.DELETE | c.WRITE_DAC | WRITE_OWNER)
# What lets a trustee rename or remove what is below a directory, or take it over.
ANCESTOR_RIGHTS = FILE_DELETE_CHILD | c.DELETE | c.WRITE_DAC | WRITE_OWNER
START_WAIT = 30.0  # seconds the install waits for the service to answer
Security = Callable[[str], tuple[str, tuple[acl.Ace, ...]]]  # path -> (owner, DACL entries)


def writable_by_others(owner: str, aces: Iterable[acl.Ace], rights: int = WRITE_RIGHTS
                       ) -> str | None:
    """Who but SYSTEM, Administrators and TrustedInstaller may change an object with this
    owner and DACL (an allow entry effective on it granting any of `rights`), or None."""
    if owner.upper() not in TRUSTED:
        return f"its owner {owner}"
    for ace in aces:
        if ace.type == acl.ALLOW and ace.effective and acl.mapped(ace.mask) & rights \
                and ace.sid.upper() not in TRUSTED:
            return ace.sid
    return None


def interpreter_refusal(prefix: str, base_prefix: str) -> str | None:
    if ntpath.normcase(prefix.rstrip("\\")) != ntpath.normcase(base_prefix.rstrip("\\")):
        return ("this is a virtual environment, whose files its user may change; install "
                "Stockade into an interpreter only administrators can change (python.org's "
                "installer for all users, in C:\\Program Files) and run this from it")
    return None


def tree(top: str) -> Iterator[str]:
    """`top` and everything below it, never through a link."""
    yield top
    for directory, subdirectories, files in os.walk(top):
        for name in subdirectories + files:
            yield os.path.join(directory, name)


def ancestors(path: str) -> list[str]:
    out = []
    while True:
        parent = ntpath.dirname(path)
        if parent == path:
            return out
        out.append(parent)
        path = parent


def code_refusal(security: Security, walk: Callable[[str], Iterable[str]], interpreter: str,
                 package: str) -> str | None:
    """Why the code the service would run is not an administrator's alone (`interpreter`: the
    interpreter's tree; `package`: the directory of `stockade`; `walk(top)`: `top` and all
    below it), or None."""
    places = list(walk(interpreter))
    if not inside(package, interpreter):
        places += list(walk(package))
    for path in places:
        who = writable_by_others(*security(path))
        if who:
            return f"{path} can be changed by {who}"
    for path in ancestors(interpreter):
        who = writable_by_others(*security(path), rights=ANCESTOR_RIGHTS)
        if who:
            return f"{path}, above the interpreter, lets {who} rename or replace what is in it"
    return None


def state_refusal(path: str, security: Security | None = None) -> str | None:
    """Why the service's state directory `path` is not SYSTEM's and the Administrators' alone
    (absent included), or None. The service refuses to start, and the install to reuse it."""
    if not os.path.isdir(path) or os.path.islink(path):
        return f"{path} is not a directory the install made"
    who = writable_by_others(*(security or read_security)(path))
    return f"{path} can be changed by {who}" if who else None


def install_commands(python: str, made: Iterable[str]) -> list[list[str]]:
    """What installing runs, after the state directories `made` were created."""
    binary = f'"{python}" -I -m stockade.windows.fenceservice'
    commands = [["icacls", path, "/inheritance:r", "/grant:r", f"*{SYSTEM}:(OI)(CI)F",
                 f"*{ADMINISTRATORS}:(OI)(CI)F", "/Q"] for path in made]
    return commands + [
        ["sc.exe", "create", SERVICE_NAME, "binPath=", binary, "start=", "auto",
         "obj=", "LocalSystem", "DisplayName=", "Stockade egress fence"],
        ["sc.exe", "description", SERVICE_NAME, "Loopback exemptions and WFP filters for "
         "Stockade's sandboxes (network allowlist and any)"],
        ["sc.exe", "failure", SERVICE_NAME, "reset=", "86400", "actions=",
         "restart/5000/restart/5000/restart/60000"],
        ["sc.exe", "start", SERVICE_NAME],
    ]


def uninstall_commands() -> list[list[str]]:
    return [["sc.exe", "stop", SERVICE_NAME], ["sc.exe", "delete", SERVICE_NAME]]


def read_security(path: str) -> tuple[str, tuple[acl.Ace, ...]]:
    """The owner and DACL entries of `path` (Windows)."""
    import ctypes

    from stockade.windows import identity
    from stockade.windows.aclstore import WindowsAclStore
    from stockade.windows.api import win32
    from stockade.windows.fsinfo import win32_path
    from stockade.windows.structs import PVOID

    api = win32()
    owner, descriptor = PVOID(), PVOID()
    api.GetNamedSecurityInfoW(win32_path(path), c.SE_FILE_OBJECT, 0x1, ctypes.byref(owner),
                              None, None, None, ctypes.byref(descriptor))
    try:
        who = identity.sid_string(owner)
    finally:
        api.LocalFree(descriptor)
    return who, WindowsAclStore().read(path).aces


def plan(security: Security, exists: Callable[[str], bool], walk: Callable[[str], Iterable[str]],
         prefix: str, base_prefix: str, package: str, python: str
         ) -> tuple[list[str], list[list[str]]]:
    """The state directories to make and the commands to run then; SetupError
    `fence_install_unsafe` when the service would run what others can change."""
    why = interpreter_refusal(prefix, base_prefix) or code_refusal(security, walk, base_prefix,
                                                                   package)
    made = []
    for path in STATES:
        if why:
            break
        if not exists(path):
            made.append(path)
        elif who := writable_by_others(*security(path)):
            why = f"{path} exists already and can be changed by {who}: remove it first"
    if why:
        raise SetupError("fence_install_unsafe", f"the service would run as LocalSystem what "
                         f"others can change: {why}", stage="install")
    return made, install_commands(python, made)


def install(run: Callable[[list[str]], int] | None = None) -> None:
    """Install and start the service (SetupError naming what is wrong otherwise)."""
    import stockade
    from stockade.windows import tokens

    if not tokens.elevated():
        raise SetupError("fence_install_not_elevated", "installing the fence service takes an "
                         "administrator: run it from an elevated prompt", stage="install")
    made, commands = plan(read_security, os.path.lexists, tree, sys.prefix, sys.base_prefix,
                          os.path.dirname(os.path.dirname(os.path.abspath(stockade.__file__))),
                          sys.executable)
    for path in made:
        os.mkdir(path)
    for command in commands:
        if (run or _run)(command):
            raise SetupError("fence_install_failed", f"{' '.join(command[:3])} failed",
                             stage="install")
    deadline = time.monotonic() + START_WAIT
    while (why := fenceclient.helper_refusal()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if why:
        raise SetupError("fence_install_failed", f"the service does not answer: {why}",
                         stage="install")


def uninstall(run: Callable[[list[str]], int] | None = None) -> None:
    """Stop the service (it takes every fence back) and delete it."""
    from stockade.windows import tokens

    if not tokens.elevated():
        raise SetupError("fence_install_not_elevated", "removing the fence service takes an "
                         "administrator: run it from an elevated prompt", stage="install")
    stop, delete = uninstall_commands()
    (run or _run)(stop)  # (fails when it is stopped already: deleting is what matters)
    if (run or _run)(delete):
        raise SetupError("fence_uninstall_failed", "sc.exe delete failed: is the service "
                         "installed, and is this an administrator?", stage="install")


def _run(command: list[str]) -> int:
    return subprocess.run(command, timeout=120).returncode
