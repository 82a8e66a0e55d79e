"""The Windows half of the readiness probe (the shared stages are stockade/launch/probe.py's).

The `launch` stage makes a fresh probe directory under the state directory — a workspace (write
root) holding a protected `.git` and a denied `secret`, and an `outside` file no root grants —
snapshots the DACLs of the workspace, `.git` and `secret` and this window station's entries,
listens on a loopback port, and runs the probe child (probe_child.py, with this interpreter)
through the backend under a minimal policy: the system root and the interpreter readable, the
workspace writable, network `none`, a closed environment, Job limits. Two kinds of facts come
back, and both are observations, never the plan echoed:

- from outside, what the backend read back from the suspended child before it ran (the
  handle's `enforced`): its token and Job membership, the Job's settings
  (QueryInformationJobObject), the handles it holds (its three standard ones, and not an
  inheritable canary outside its handle list), its mitigation policies, the desktop's and the
  window station's entries for its AppContainer, its creator and the broker's PID, and whether
  the broker's manifest was gone once it answered;
- from inside, the child's own report: its token, its Job and that Job's settings as the
  child queries them, its mitigation policies, the desktop its thread is on (the launch's) and
  whether the user's default desktop opens, its environment, its file and loopback attempts.

Each fact belongs to a stage of EXPECTATIONS; the first stage with a fact that does not hold
fails readiness as `<stage>_not_enforced`. A child that does not exit 0 with a report (it could
not start on the private desktop, say) fails the `launch` stage as `probe_command_failed`.
Then, once the launch has settled: the AppContainer profile is gone (asked without side
effects, identity.profile_exists), every DACL and the window station's entries are exactly as
before, and the launch's ledger record is gone.

Whether the child can open the user's `Default` desktop is reported (`default_desktop`), not
required: in an interactive session an AppContainer most likely can (the window station is the
user's, and its desktops' DACLs are not the launch's to change), so requiring it would fail
every Windows desktop; the report's `desktop` row is partial when it opened. Only a window
station of the sandbox's own or a process without Win32k would close that.

Facts are booleans, counts and names; the attestation never holds a path, a SID or the
profile's name.

A pass is stored for later processes (`storage`, the shared probe's store in the state
directory, which every launch masks): valid for this boot, this Windows build and update
revision (UBR), the probe policy's inputs (system root, limits, the probe child), this user as
it runs now (elevated or not, its session, the kind of Job it is in: none, one its children
leave, one that keeps them, one with UI limits — each changes what the launch can do), this
interpreter file and these Stockade and Python versions, for the shared store's TTL (600 s,
counted by GetTickCount64, which counts sleep and hibernation); any change probes again. The
"boot" is the boot time to a minute, which a Fast Startup power cycle (the kernel session
hibernated, not shut down) keeps: an update installed across one changes the build's UBR, and
whatever else changed is bounded by the TTL. Such a process still runs the backend's host checks and
reconciles the ledger (issue 31, D10).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import secrets
import shutil
import socket
import sys
import time
from typing import Protocol

from stockade import __version__
from stockade.errors import StockadeError
from stockade.launch.probe import Refused, Run
from stockade.launch.request import LaunchRequest, LimitSpec, PathGrant
from stockade.lifecycle import facts, removers, statedir
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.windows import (
    admission,
    desktop,
    fsinfo,
    identity,
    probe_child,
    process,
    program,
    tokens,
)
from stockade.windows import constants as c
from stockade.windows import job as jobs
from stockade.windows.acl import Ace, Dacl
from stockade.windows.structs import (
    JOBOBJECT_BASIC_UI_RESTRICTIONS,
    JOBOBJECT_CPU_RATE_CONTROL_INFORMATION,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
)

# The Linux probe's limits (linux/probe.py) without file_size (Windows has no such limit:
# rules.py).
PROBE_LIMITS = LimitSpec(timeout=30.0, memory=facts.PROBE_MEMORY, pids=facts.PROBE_PIDS,
                         output=1 << 20)
PROTECTED, DENIED, OUTSIDE = ".git", "secret", "outside"
PROBE_ENVIRONMENT = ("PATH", "SystemRoot")
# What the backend adds to every launch that does not name them: TEMP and TMP, the launch's own
# temp folder in its AppContainer's profile (envblock.with_temp; issue 31, L12).
LAUNCH_ENVIRONMENT = ("TEMP", "TMP")
# What Windows itself may add to an AppContainer child's environment: the profile's own storage
# (its LOCALAPPDATA, TEMP and TMP, redirected to the AppContainer's folder) — never a value of
# the owner's (issue 31, D12).
PROFILE_ENVIRONMENT = ("LOCALAPPDATA", "TEMP", "TMP")
NESTED_UI = "none: the owner is in a Job"  # (job.py: Jobs with UI limits do not nest)
_STRUCTURES = {"extended": JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
               "ui": JOBOBJECT_BASIC_UI_RESTRICTIONS,
               "cpu_rate": JOBOBJECT_CPU_RATE_CONTROL_INFORMATION}


def _at_least(minimum: int) -> facts.Check:
    return ((lambda value: type(value) is int and value >= minimum), f"at least {minimum}")


# stage -> fact -> check; the order is the order in which stages fail. `child_*` facts are the
# probe child's own report; the others were read back from outside.
_is = facts.exactly
_denied = ((lambda value: value == "denied"), "'denied'")
EXPECTATIONS: facts.Table = {
    "identity": {"appcontainer_token": _is(True), "launch_package_sid": _is(True),
                 "capabilities": _is(0), "child_appcontainer_token": _is(True),
                 "child_launch_package_sid": _is(True), "child_capabilities": _is(0)},
    # The child was made by the launch's broker, another process, which consumed its manifest.
    "broker": {"launch_brokered": _is(True), "manifest_consumed": _is(True)},
    "job": {"in_job": _is(True), "job_kill_on_close": _is(True), "job_breakaway": _is(False),
            "job_die_on_unhandled_exception": _is(True),
            "job_ui_restrictions": ((lambda v: v in ("all", NESTED_UI)), f"'all' or {NESTED_UI!r}"),
            "child_in_job": _is(True), "child_sees_the_job": _is(True)},
    "desktop": {"private_desktop": _is(True), "desktop_rights": _is(True),
                "station_rights": _is(True)},
    "handles": {"inherited_standard": _is(3), "inherited_outside_list": _is(0)},
    # The workspace granted; `.git` made read-only and `secret` denied, each an override.
    "filesystem": {"acl_grants": _at_least(1), "acl_overrides": _at_least(2),
                   "write_root": _is("ok"), "protected_name": _denied, "denied_path": _denied,
                   "outside_path": _denied, "no_low_label_images": _is(True),
                   "extension_points_disabled": _is(True), "no_remote_images": _is(True),
                   "child_mitigations_as_read_back": _is(True)},
    "network": {"tcp_loopback": ((lambda v: isinstance(v, str) and v != "ok"), "an error")},
    "environment": {"environment": (
        (lambda names: isinstance(names, list)
         and {n.upper() for n in PROBE_ENVIRONMENT + LAUNCH_ENVIRONMENT} <= set(names)
         <= {n.upper() for n in PROBE_ENVIRONMENT + LAUNCH_ENVIRONMENT + PROFILE_ENVIRONMENT}),
        f"{sorted(PROBE_ENVIRONMENT + LAUNCH_ENVIRONMENT)}, and no more than "
        f"{sorted(PROFILE_ENVIRONMENT)}"),
        "temp_writable": _is("ok")},
    "limits": {"job_memory": _is(facts.PROBE_MEMORY), "job_active_processes": _is(facts.PROBE_PIDS),
               "timeout": _is(True)},
    "lifetime": {"profile_deleted": _is(True), "acl_restored": _is(True),
                 "station_restored": _is(True), "ledger_settled": _is(True)},
}


# What each fact is, in one line (`stockade probe --explain`); `child_` facts are the child's
# own view, the others were read back from outside before it ran.
LEGEND = {
    "exit_code": "the probe child's exit status (0: it reported)",
    "appcontainer_token": "the child's token is an AppContainer token",
    "launch_package_sid": "its AppContainer is this launch's own",
    "capabilities": "the capabilities its token holds beyond its runtime roots' standing "
                    "grants' (0)",
    "temp_writable": "the child can make a file in its own TEMP (the AppContainer's AC\\Temp)",
    "child_appcontainer_token": "the child sees an AppContainer token",
    "child_launch_package_sid": "the child sees this launch's AppContainer",
    "child_capabilities": "the capabilities the child sees beyond its runtime roots' (0)",
    "launch_brokered": "the child was created by the launch's one-shot broker, a process "
                       "other than this one (its creator, as read back)",
    "manifest_consumed": "the broker's manifest was gone once the broker had answered",
    "in_job": "the child is in the launch's Job",
    "job_kill_on_close": "the Job kills its processes when its handle closes",
    "job_breakaway": "a process may break away from the Job (must be false)",
    "job_die_on_unhandled_exception": "a crash ends the process, no error dialog",
    "job_ui_restrictions": "the Job's UI limits (all; none when the owner's Job keeps "
                           "its children, which only a Job without them may join)",
    "child_in_job": "the child sees itself in a Job",
    "child_sees_the_job": "the Job's settings the child reads are the launch's",
    "private_desktop": "the child runs on the launch's own desktop",
    "default_desktop": "whether the child could open the user's Default desktop (informative)",
    "desktop_rights": "the desktop grants the launch's AppContainer only what it needs",
    "station_rights": "the window station grants the AppContainer only what it needs",
    "inherited_standard": "standard handles the child holds (3)",
    "inherited_outside_list": "inheritable handles outside its list that it holds (0)",
    "acl_grants": "access entries granted for the launch's roots",
    "acl_overrides": "entries overriding them (.git read-only, the denied name)",
    "roots_open_to_every_appcontainer": "roots already open to every AppContainer "
                                        "(informative: left alone)",
    "runtime_roots": "read roots served by a standing grant (informative: granted once, "
                     "reused by later launches)",
    "write_root": "a file written in the workspace, a write root (must work: ok)",
    "protected_name": "a file written under the protected .git",
    "denied_path": "the denied name of the workspace opened",
    "outside_path": "a file outside every root opened",
    "no_low_label_images": "the child may load no low-integrity image",
    "extension_points_disabled": "legacy extension points (AppInit DLLs...) are off",
    "no_remote_images": "the child may load no image from a remote share",
    "child_mitigations_as_read_back": "the mitigations the child sees are those read back",
    "tcp_loopback": "a TCP connection to a listener on the host's loopback",
    "environment": "the names in the child's environment (the policy's, and the profile's)",
    "job_memory": "the Job's memory limit, in bytes",
    "job_active_processes": "the Job's limit on live processes",
    "timeout": "the launch has a wall-clock limit",
    "profile_deleted": "the launch's AppContainer profile removed once it ended",
    "acl_restored": "every access list changed is as before once it ended",
    "station_restored": "the window station's entries are as before once it ended",
    "ledger_settled": "the launch's record removed once it ended",
}


class Host(Protocol):
    """What the probe asks Windows itself (a model in the tests)."""

    def elevated(self) -> bool: ...

    def dacl(self, path: str) -> Dacl: ...

    def station_aces(self) -> tuple[Ace, ...]:
        """This process's window station's entries."""

    def package_sid(self, name: str) -> str:
        """The package SID of the AppContainer profile `name` (derived, whether it exists)."""

    def profile_exists(self, name: str) -> bool:
        """Whether the AppContainer profile `name` exists (asked without side effects)."""

    def interpreter(self) -> str:
        """The program that runs the probe child: this Python's."""

    def uptime(self) -> float:
        """Seconds since this boot, sleep and hibernation counted."""

    def user_sid(self) -> str: ...

    def session(self) -> int: ...

    def owner_job(self) -> jobs.OwnerJob: ...

    def os_build(self) -> str:
        """This Windows' build and update revision (UBR), e.g. "26100.4061"."""


# The boot's identity is its start, wall clock less uptime, to this many seconds (a clock set
# across a step of it only makes the next process probe again).
BOOT_GRAIN = 60


class Win32Host:
    def elevated(self) -> bool:
        from stockade.windows import tokens
        return tokens.elevated()

    def dacl(self, path: str) -> Dacl:
        from stockade.windows.aclstore import WindowsAclStore
        return WindowsAclStore().read(path)

    def station_aces(self) -> tuple[Ace, ...]:
        from stockade.windows import desktop
        return desktop.change_station(desktop.window_station(), lambda aces: aces)

    def package_sid(self, name: str) -> str:
        return identity.derive_sid(name)

    def profile_exists(self, name: str) -> bool:
        return identity.profile_exists(name)

    def interpreter(self) -> str:
        return program.interpreter()

    def uptime(self) -> float:
        from stockade.windows.api import win32
        return win32().GetTickCount64() / 1000  # (interrupt time: sleep counted)

    def user_sid(self) -> str:
        return tokens.current_user_sid()

    def session(self) -> int:
        return tokens.session_id()

    def owner_job(self) -> jobs.OwnerJob:
        return jobs.owner_job()

    def os_build(self) -> str:
        import winreg  # Windows only

        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,
                            "SOFTWARE\\Microsoft\\Windows NT\\CurrentVersion") as key:
            return ".".join(str(winreg.QueryValueEx(key, name)[0])
                            for name in ("CurrentBuildNumber", "UBR"))


class WindowsProbe:
    """`PlatformProbe` for the Windows backend; `host` defaults to the real one."""

    messages = {
        "windows_too_old": "the Windows backend needs Windows 10 1809 (build 17763) or later",
        "probe_command_failed": "the probe child did not exit 0 with its report (it may not "
                                "have been able to start on the private desktop)",
        "confinement_unverified": "the probe child's token, Job, handles, mitigations or "
                                  "desktop, as read back, were not as launched; it was "
                                  "terminated before it ran",
        "job_not_drained": "the probe sandbox's processes did not all exit after it was "
                           "terminated",
        "windows_setup_failed": "a Win32 call failed while setting up the probe sandbox",
        "window_station_denied": "this user may not change its window station's access control "
                                 "or create a desktop on it (started under other credentials "
                                 "on a station that grants it nothing?)",
        "owner_job_not_nestable": "this process is in a Job that sets UI limits, which no "
                                  "other Job may be nested in",
    }
    legend = LEGEND

    def __init__(self, host: Host | None = None) -> None:
        self.host = host or Win32Host()

    def run_as(self) -> str:
        try:
            return "elevated" if self.host.elevated() else "unelevated"
        except (OSError, StockadeError):  # not Windows: the backend stage has said why
            return "unknown"

    def versions(self) -> dict[str, object]:
        return {"stockade": __version__, "windows": platform.version(),
                "python": platform.python_version()}

    def storage(self) -> tuple[dict[str, object], float] | None:
        """What a stored pass is valid for (the module's docstring), and seconds since boot;
        None where the host cannot say (every process probes then). Digests stand for the
        user's SID and the interpreter's path: the state directory holds neither."""
        try:
            uptime = self.host.uptime()
            python = self.host.interpreter()
            info = os.stat(python)
            key = {"boot": int((time.time() - uptime) // BOOT_GRAIN),
                   "os_build": self.host.os_build(), "inputs": _inputs(),
                   "user": _digest(self.host.user_sid()), "run_as": self.run_as(),
                   "session": self.host.session(), "owner_job": self.host.owner_job().value,
                   "interpreter": _digest(python, fsinfo.file_id(info), str(info.st_size),
                                          str(info.st_mtime_ns)),
                   "versions": self.versions()}
        except (OSError, StockadeError):
            return None
        return key, uptime

    def explain(self, message: str) -> str:
        return message

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed, EXPECTATIONS)

    def launch(self, run: Run, ledger: Ledger) -> None:
        """Run the probe child in a sandbox, recording what it and the backend saw into `run`."""
        work = os.path.join(ledger.root, "work")
        statedir.ensure(work)
        # Not a ledger "dir" record: that remover is POSIX-only. Removed below; a crash leaves
        # an empty tree whose grants the backend's own records revert.
        top = os.path.join(work, removers.fresh_name("probe"))
        os.mkdir(top, 0o700)
        try:
            self._launch_in(run, ledger, os.path.realpath(top))  # long names, never 8.3
        finally:
            shutil.rmtree(top, ignore_errors=True)

    def _launch_in(self, run: Run, ledger: Ledger, top: str) -> None:
        from stockade.launch.manager import execute

        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            request = probe_request(top, secrets.token_hex(16), listener.getsockname()[1],
                                    self.host.interpreter())
            paths = (request.cwd, *(os.path.join(request.cwd, n) for n in (PROTECTED, DENIED)))
            before = [self.host.dacl(path) for path in paths]
            station = self.host.station_aces()
            run.backend.check(request)
            result = execute(run.backend, request)
        run.enforced = result.enforced
        run.facts["exit_code"] = result.exit_code
        if result.exit_code != 0:
            raise Refused("probe_command_failed", self.messages["probe_command_failed"])
        name = identity.profile_name(request.request_id, set())
        try:
            run.facts |= launch_facts(result.enforced, json.loads(result.stdout),
                                      self.host.package_sid(name))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Refused("probe_command_failed",
                          self.messages["probe_command_failed"]) from None
        record = os.path.basename(LaunchRecord(ledger, request.request_id).path)
        run.facts |= {
            "profile_deleted": not self.host.profile_exists(name),
            "acl_restored": [self.host.dacl(path) for path in paths] == before,
            "station_restored": self.host.station_aces() == station,
            "ledger_settled": record not in ledger.records(),
        }


def _inputs() -> str:
    """A digest of what the probe's policy is made of here: the system root it reads, its
    limits and the probe child's source."""
    with open(probe_child.__file__, "rb") as f:
        child = hashlib.sha256(f.read()).hexdigest()
    return _digest(os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows")),
                   repr(PROBE_LIMITS), child)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def probe_request(top: str, request_id: str, tcp_port: int, python: str) -> LaunchRequest:
    """The probe's minimal request, in `top`: the system root and the interpreter `python`
    readable, a workspace writable with a protected and a denied name in it, an outside file,
    network none, Job limits; the child told where to knock."""
    system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
    workspace = os.path.join(top, "ws")
    outside = os.path.join(top, OUTSIDE, "file")
    for path in (workspace, *(os.path.join(workspace, n) for n in (PROTECTED, DENIED)),
                 os.path.dirname(outside)):
        os.mkdir(path, 0o700)
    with open(outside, "w") as f:
        f.write("outside every root\n")
    params = {"sizes": {name: ctypes.sizeof(kind) for name, kind in _STRUCTURES.items()},
              "protected": os.path.join(workspace, PROTECTED, "planted"),
              "denied": os.path.join(workspace, DENIED), "outside": outside,
              "tcp_port": tcp_port}
    with open(probe_child.__file__) as f:
        source = f.read()
    reads = sorted({system_root, os.path.dirname(python),
                    os.path.realpath(sys.base_prefix)}, key=str.casefold)
    return LaunchRequest(
        argv=(python, "-I", "-S", "-c", source, json.dumps(params)), cwd=workspace,
        env=(("PATH", os.path.join(system_root, "System32")), ("SystemRoot", system_root)),
        read=tuple(PathGrant(p, p) for p in reads if not admission.inside(p, workspace)),
        write=(PathGrant(workspace, workspace),),
        deny=(PathGrant(params["denied"], params["denied"]),),
        protected=(PROTECTED,), limits=PROBE_LIMITS, request_id=request_id)


def launch_facts(enforced: dict, report: dict, package_sid: str) -> dict[str, object]:
    """The facts of EXPECTATIONS from a launch's `enforced` (read back from outside) and its
    child's `report` (from inside), `package_sid` being the launch's; a missing one is None.
    Also, for information, `roots_open_to_every_appcontainer`, `runtime_roots` and
    `default_desktop`."""
    verified = enforced.get("verified", {})
    job_seen = enforced.get("job", {})
    done = enforced.get("filesystem", {})
    desk = enforced.get("desktop", {})
    held = enforced.get("handles", {})
    mitigations = enforced.get("mitigations", 0)
    broker = enforced.get("broker", {})
    child = child_facts(report)
    return {
        "launch_brokered": broker.get("creator") == broker.get("pid")
        not in (None, os.getpid()),
        "manifest_consumed": broker.get("manifest_consumed"),
        **{fact: verified.get(fact) for fact in ("appcontainer_token", "launch_package_sid",
                                                 "capabilities", "in_job")},
        "child_appcontainer_token": child["appcontainer_token"],
        "child_launch_package_sid": child["package_sid"].upper() == package_sid.upper(),
        # (beyond the runtime roots' standing capabilities, whose SIDs the backend compared)
        "child_capabilities": child["capabilities"] - enforced.get("capabilities", 0),
        **{f"job_{name}": job_seen.get(name) for name in
           ("kill_on_close", "breakaway", "die_on_unhandled_exception")},
        "job_ui_restrictions": NESTED_UI if enforced.get("owner_in_job") and
        job_seen.get("ui_restrictions") == "none" else job_seen.get("ui_restrictions"),
        "child_in_job": child["in_job"], "child_sees_the_job": child["job"] == job_seen,
        "private_desktop": child["desktop"] == desk.get("name"),
        "default_desktop": report["desktop"]["default_desktop"],
        "desktop_rights": (desk.get("appcontainer_rights"),
                           desk.get("every_appcontainer_rights")) == (
                               desktop.APPCONTAINER_RIGHTS, 0),
        "station_rights": desk.get("station_rights") == desktop.STATION_RIGHTS,
        "inherited_standard": held.get("standard"),
        "inherited_outside_list": held.get("outside_list"),
        "acl_grants": done.get("grants"), "acl_overrides": done.get("overrides"),
        "roots_open_to_every_appcontainer": done.get("roots_open_to_every_appcontainer"),
        "runtime_roots": done.get("runtime_roots"),
        **{fact: report["files"][fact] for fact in ("write_root", "protected_name",
                                                    "denied_path", "outside_path")},
        "no_low_label_images": bool(
            child["mitigations"] & c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON),
        "extension_points_disabled": bool(
            child["mitigations"] & c.MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON),
        "no_remote_images": bool(
            child["mitigations"] & c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON),
        "child_mitigations_as_read_back": child["mitigations"] == mitigations,
        "tcp_loopback": report["tcp_loopback"],
        "environment": sorted(name.upper() for name in report["environment"]),
        "temp_writable": report["temp"],
        "job_memory": job_seen.get("memory"),
        "job_active_processes": job_seen.get("active_processes"),
        "timeout": "timeout" in enforced.get("limits", {}),
    }


def child_facts(report: dict) -> dict:
    """The probe child's raw answers decoded with the backend's own layouts (structs.py);
    ValueError (or KeyError, TypeError) for a report that is not one."""
    token, job_seen, policies = report["token"], report["job"], report["mitigations"]

    def raw(answer: dict) -> bytes:
        return bytes.fromhex(answer["hex"])

    def dword(answer: dict) -> int:
        return int.from_bytes(raw(answer)[:4], "little")

    structures = {name: kind.from_buffer_copy(raw(job_seen[name]))
                  for name, kind in _STRUCTURES.items()}
    return {"appcontainer_token": bool(dword(token["is_appcontainer"])),
            "package_sid": tokens.package_sid(raw(token["package"]),
                                              token["package"]["address"]),
            "capabilities": dword(token["capabilities"]),
            "in_job": job_seen["in_job"] is True,
            "job": jobs.settings(structures["extended"], structures["ui"],
                                 structures["cpu_rate"]),
            "mitigations": process.mitigation_bits(dword(policies["extension_points"]),
                                                   dword(policies["image_load"])),
            "desktop": report["desktop"]["name"]}


def verified(observed: dict[str, object], *names: str) -> bool:
    """Whether each named fact is present in `observed` and holds (for the report)."""
    return facts.verified(observed, *names, table=EXPECTATIONS)
