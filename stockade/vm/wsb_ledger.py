"""The Windows Sandbox guests this user's processes start, in the launch ledger
(stockade/lifecycle/ledger.py), so that a guest whose process was killed without its exit
handlers (the daemon's `close`) is ended by the next reconcile: `stockade reconcile`, or the
next boot's (wsb.start_guest). A running process's guest is never touched: the ledger acts on a
record only once its lease is free, that is once its process is gone.

A guest is one record (request id `wsb-BOOT_ID`) holding one resource of kind `wsbguest`, named
by the boot id (32 hex digits; the sandbox's id and its per-boot folder `STATE_DIR\\wsb\\BOOT_ID`
derive from it, never from the record):

- started by the `wsb` command-line tool: recorded before `wsb start`, detail
  `{"launcher": "wsb"}`; ended with `wsb stop --id`, and gone once `wsb list` no longer
  names it;
- started as `WindowsSandbox.exe FILE.wsb`: recorded as soon as that process exists, before
  the boot is waited for, detail `{"launcher": "exe", "pid": ..., "created": ...}` (its
  identity, procid.py); ended by ending that very process, never one that only has its id.

Once the guest is gone its per-boot folder is removed. What cannot be done (the `wsb` tool
gone, its list failing, a process that will not end) keeps the record (RemovalError) for the
next reconcile. A host killed between starting WindowsSandbox.exe and recording it (one call)
leaves that guest unrecorded, as a QEMU guest's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from stockade.errors import UnavailableError
from stockade.lifecycle import removers, statedir
from stockade.vm import wsb_launcher
from stockade.windows import procid

KIND = "wsbguest"
BY_ID = {"launcher": wsb_launcher.CLI}
TOOL_TIMEOUT = 120.0  # seconds `wsb list` or `wsb stop` may take
_BOOT_ID = re.compile(r"[0-9a-f]{32}")


def started(pid: int) -> dict:
    """The detail of a guest started as WindowsSandbox.exe, process `pid` (ask while its Popen
    holds it)."""
    return {"launcher": wsb_launcher.PROGRAM, "pid": pid, "created": procid.created(pid)}


def sandbox_id(boot_id: str) -> str:
    """The GUID the `wsb` tool knows the guest of `boot_id` by."""
    return f"{boot_id[:8]}-{boot_id[8:12]}-{boot_id[12:16]}-{boot_id[16:20]}-{boot_id[20:]}"


def workdir(boot_id: str) -> str:
    """The guest's per-boot folder."""
    return os.path.join(statedir.state_dir(), "wsb", boot_id)


def validate(name: str, detail: dict) -> None:
    if not _BOOT_ID.fullmatch(name):
        raise ValueError("a wsbguest record is named by its boot id, 32 hex digits")
    if detail == BY_ID:
        return
    if set(detail) != {"launcher", "pid", "created"} or detail["launcher"] != \
            wsb_launcher.PROGRAM or not all(type(detail[key]) is int and 0 < detail[key] < 1 << 64
                                            for key in ("pid", "created")):
        raise ValueError('a wsbguest detail is {"launcher": "wsb"}, or "exe" with the '
                         "process id and creation time of WindowsSandbox.exe")


def remove(name: str, detail: dict) -> None:
    """End the guest `name` if it runs, then remove its per-boot folder."""
    if detail["launcher"] == wsb_launcher.PROGRAM:
        if not procid.end(detail["pid"], detail["created"]):
            raise removers.RemovalError("its WindowsSandbox.exe did not end")
    else:
        _stop_by_id(sandbox_id(name))
    shutil.rmtree(workdir(name), ignore_errors=True)


def register_kinds() -> None:
    removers.register(KIND, validate, remove)


def _stop_by_id(guid: str) -> None:
    try:
        launcher = wsb_launcher.here()
    except UnavailableError:
        launcher = None
    if launcher is None or launcher.kind != wsb_launcher.CLI:
        raise removers.RemovalError("the wsb command-line tool that started it is gone: "
                                    f"stop the sandbox {guid} by hand")
    if not _listed(launcher, guid):
        return
    _run(launcher.stop(guid))  # (its status aside: the list says whether it is gone)
    if _listed(launcher, guid):
        raise removers.RemovalError(f"wsb stop --id {guid} did not stop it")


def _listed(launcher: wsb_launcher.Launcher, guid: str) -> bool:
    """Whether `wsb list` names the sandbox `guid` (its output read as text, whatever its
    format)."""
    done = _run([launcher.program, "list"])
    if done.returncode != 0:
        raise removers.RemovalError(f"wsb list exited with {done.returncode}: whether {guid} "
                                    "runs is not known")
    return guid in done.stdout.decode("utf-8", "replace").lower()


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=TOOL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise removers.RemovalError(f"{' '.join(argv[1:2])} did not answer in "
                                    f"{TOOL_TIMEOUT:g}s") from None
