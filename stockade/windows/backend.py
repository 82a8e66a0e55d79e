"""WindowsBackend: the Backend contract on Windows (a launch itself is handle.py's)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from stockade.errors import UnavailableError
from stockade.launch.backend import Backend, Capability, Stdio, refuse_other_containment
from stockade.launch.request import LaunchRequest
from stockade.windows import fenceclient, fsinfo, rules
from stockade.windows.api import win32
from stockade.windows.handle import WindowsHandle

if TYPE_CHECKING:
    from stockade.launch.probe import Attestation
    from stockade.launch.report import Row
    from stockade.windows.probe import WindowsProbe

# Windows 10 1809 / Server 2019: an AppContainer created with the mitigation-policy attribute
# fails before it, and DeleteFileW's POSIX semantics, which the ledger relies on, start there.
MINIMUM_BUILD = 17763


def build_refusal(build: int) -> str | None:
    """Why this Windows build cannot run the backend, or None."""
    if build < MINIMUM_BUILD:
        return (f"Windows build {build}; the backend needs Windows 10 1809 (build "
                f"{MINIMUM_BUILD}) or later")
    return None


class WindowsBackend(Backend):
    name = "windows"

    def probe(self) -> None:
        if sys.platform != "win32":
            raise UnavailableError("backend_unavailable",
                                   "the Windows backend runs only on Windows")
        why = build_refusal(sys.getwindowsversion().build)
        if why:
            raise UnavailableError("windows_too_old", why)
        try:
            win32()
        except (AttributeError, OSError) as exc:  # (a function, or a whole DLL, missing)
            raise UnavailableError("backend_unavailable",
                                   f"a Win32 function is missing: {exc}") from None

    def check(self, request: LaunchRequest) -> None:
        refuse_other_containment(request, self.name, "native")
        windows = sys.platform == "win32"
        rules.check(request, fsinfo.long_path if windows else None,
                    fenceclient.helper_refusal if windows else None)

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> WindowsHandle:
        return WindowsHandle(request, stdio)

    def report(self) -> list[Capability]:
        return REPORT

    def readiness_probe(self) -> WindowsProbe:
        from stockade.windows.probe import WindowsProbe

        return WindowsProbe()

    def report_rows(self, attestation: Attestation) -> tuple[Row, ...]:
        from stockade.windows.report import rows

        return rows(attestation, self)


REPORT = [
    Capability("identity", True, "a fresh AppContainer profile per launch, no capabilities "
               "but its runtime roots' read capabilities (standing grants)",
               "deleted at settlement; its name is never handed out again"),
    Capability("broker", True, "a one-shot broker process per launch, the only caller of the "
               "AppContainer launcher, launching only from a closed manifest bound to its PID, "
               "a nonce and the request's digest, recomputed",
               "same user as the owner: no boundary against that user's own processes"),
    Capability("filesystem.read", True, "read+execute entries for the launch's package SID "
               "on each read root", "anything open to every AppContainer (ALL APPLICATION "
               "PACKAGES: C:\\Windows, C:\\Program Files, ...) is readable whatever the policy"),
    Capability("filesystem.write", True, "modify entries (no FILE_DELETE_CHILD) on each write "
               "root; inherited by what the child creates"),
    Capability("filesystem.deny", True, "a protected DACL without the launch's entries; "
               "refused when ALL APPLICATION PACKAGES may read the path"),
    Capability("filesystem.protected", True, "each occurrence at launch made read-only (a "
               "protected DACL), the directories above it unable to be deleted or renamed",
               "names created during the run are writable; launches over one tree take turns"),
    Capability("filesystem.git", True, "every .git at launch protected whole, as a protected "
               "name (filesystem.git \"guarded\" is enforced as \"read-only\")",
               "git can read a repository but not commit; \"writable\" leaves .git as is"),
    Capability("filesystem.exec_from_write", True, "files in write roots lack FILE_EXECUTE; "
               "Low-labelled images refused by mitigation policy",
               "an interpreter may still read and run a script from a write root"),
    Capability("filesystem.links", True, "roots with reparse points (but cloud placeholders) "
               "and write roots with multiply-linked files are refused before any access "
               "control changes", "a multiply-linked file in a read root is readable through "
               "its other names too (the same content)"),
    Capability("network.none", True, "an AppContainer without network capabilities",
               "whether it may open listening sockets is for the Windows workflow to verify"),
    # (Not claimed here: both need the fence service, which `check` asks for and the report's
    # rows show per host: stockade/windows/report.py.)
    Capability("network.allowlist", False, "Stockade's proxy on the host's loopback; the "
               "egress fence service exempts the launch's AppContainer from loopback isolation "
               "and adds WFP filters for its package SID that leave it the proxy's port alone",
               "refused without the fence service (`stockade fence install`)"),
    Capability("network.any", False, "the internetClient capability, loopback isolation kept; "
               "the fence service's WFP filters for the package SID keep it from the "
               "destination guard's ranges (link-local, metadata, private, reserved)",
               "refused without the fence service (`stockade fence install`)"),
    Capability("env", True, "a closed, sorted environment block"),
    Capability("limits.memory", True, "Job memory limit", "the whole tree's committed memory"),
    Capability("limits.pids", True, "Job active-process limit", "processes, not threads"),
    Capability("limits.cpu", True, "Job CPU rate, hard cap", "a share of all processors"),
    Capability("limits.file_size", False, "Windows has no per-file size limit"),
    Capability("limits.timeout", True, "wall clock; the Job is terminated"),
    Capability("kill_on_close", True, "Job kill-on-close, attached at creation, no breakaway",
               "the owner holds the only handle: its death ends the tree"),
    Capability("desktop", True, "a private desktop per launch, Low integrity label, the "
               "AppContainer allowed only to attach and create windows"),
    Capability("handles", True, "only the three standard handles are inherited"),
]


