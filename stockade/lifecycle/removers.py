"""How each kind of durable launch resource is named, validated and removed.

Every remover is idempotent (a resource that is already gone is removed) and refuses to guess:
a path must be absolute, normal and end in a name `fresh_name` handed out, and must be of the
recorded type and owned by this user; a process is killed only if the very process recorded —
same boot, same pid, same start time — still runs. So a record can never direct the removal of
anything Stockade did not create. A kind defined elsewhere (a backend's own resources, e.g.
stockade/windows/records.py) is registered by its owner with `register`, with its validator:
this module imports no backend.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import shutil
import signal
import stat
from collections.abc import Callable

NAME = re.compile(r"stockade-[a-z][a-z0-9]{0,15}-[0-9a-f]{24}")
_LABEL = re.compile(r"[a-z][a-z0-9-]{0,63}")
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_KILL_WAIT_SECONDS = 5.0


class RemovalError(Exception):
    """A resource exists but cannot be removed safely (its record is kept)."""


def fresh_name(purpose: str) -> str:
    """A new, random name for something a launch creates, e.g. `stockade-proxy-<24 hex>`."""
    name = f"stockade-{purpose}-{secrets.token_hex(12)}"
    if not NAME.fullmatch(name):
        raise ValueError(f"purpose {purpose!r} must be 1-16 lower-case letters and digits")
    return name


def process_identity(pid: int) -> dict[str, object]:
    """What a "process" record's detail must hold: boot id, pid and start time."""
    return {"boot": _boot_id(), "pid": pid, "start": _start_time(pid)}


def validate(kind: str, name: str, detail: dict) -> None:
    """Raise ValueError unless (kind, name, detail) is something a remover can act on."""
    if kind not in REMOVERS:
        raise ValueError(f"unknown resource kind {kind!r}")
    if kind in _VALIDATORS:
        _VALIDATORS[kind](name, detail)
        return
    if kind == "process":
        if not _LABEL.fullmatch(name):
            raise ValueError("a process label is lower-case letters, digits and dashes")
        if not (isinstance(detail.get("boot"), str) and type(detail.get("pid")) is int
                and type(detail.get("start")) is int):
            raise ValueError("a process detail needs boot, pid and start")
        return
    if not (os.path.isabs(name) and os.path.normpath(name) == name
            and NAME.fullmatch(os.path.basename(name))):
        raise ValueError("a path resource must be absolute, normal, and named by fresh_name")


def _remove_dir(path: str, detail: dict) -> None:
    # rmtree works through descriptors on Linux: it never follows a symbolic link.
    _remove_path(path, stat.S_ISDIR, shutil.rmtree, "not a directory")


def _remove_socket(path: str, detail: dict) -> None:
    _remove_path(path, stat.S_ISSOCK, os.unlink, "not a socket")


def _remove_path(path: str, is_kind: Callable[[int], bool], remove: Callable[[str], None],
                 mismatch: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if info.st_uid != os.geteuid():
        raise RemovalError("owned by another user")
    if not is_kind(info.st_mode):
        raise RemovalError(mismatch)
    remove(path)


def _remove_process(label: str, detail: dict) -> None:
    if detail["boot"] != _boot_id():
        return  # recorded before a reboot: long gone
    try:
        pidfd = os.pidfd_open(detail["pid"])
    except ProcessLookupError:
        return
    try:
        # The pidfd pins the process; if the start time still matches after it was opened,
        # it is the recorded one (a recycled pid has a later start time).
        try:
            if _start_time(detail["pid"]) != detail["start"]:
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(int(_KILL_WAIT_SECONDS * 1000)):
            raise RemovalError("the process did not exit after SIGKILL")
    finally:
        os.close(pidfd)


REMOVERS: dict[str, Callable[[str, dict], None]] = {
    "dir": _remove_dir,
    "socket": _remove_socket,
    "process": _remove_process,
}
_VALIDATORS: dict[str, Callable[[str, dict], None]] = {}


def register(kind: str, validator: Callable[[str, dict], None],
             remover: Callable[[str, dict], None]) -> None:
    """Add a resource kind: `validator` raises ValueError for anything `remover` could not
    act on safely. Registering a kind again replaces it; a built-in kind cannot be replaced."""
    if kind in REMOVERS and kind not in _VALIDATORS:
        raise ValueError(f"{kind!r} is a built-in resource kind")
    _VALIDATORS[kind] = validator
    REMOVERS[kind] = remover


def _boot_id() -> str:
    with open(_BOOT_ID) as f:
        return f.read().strip()


def _start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat: start time in clock ticks after boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])
