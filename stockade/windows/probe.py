"""The Windows half of the readiness probe (the shared stages are stockade/lifecycle/probe.py's).

The `launch` stage makes a fresh probe directory under the state directory — a workspace (write
root) holding a protected `.git` and a denied `secret` — snapshots the DACLs of those three
paths, and runs `cmd.exe /d /c exit 0` through the backend under a minimal policy: the system
root readable, the workspace writable, network `none`, a closed environment, Job limits. A
launch only starts once the backend has checked the suspended child's token and Job membership;
what it observed and applied is the handle's `enforced`, from which the facts below are taken.
Then, once the launch has settled: the AppContainer profile is gone, every DACL is exactly as
before, and the launch's ledger record is gone.

Each fact belongs to a stage of EXPECTATIONS; the first stage with a fact that does not hold
fails readiness as `<stage>_not_enforced`. `cmd.exe` not exiting 0 (it could not start on the
private desktop, say) fails the `launch` stage as `probe_command_failed`.

What this probe does not observe, because `cmd.exe /d /c exit 0` reports nothing back: the
child's actual access to files, the network and the environment (the real-child tests in
tests/test_windows_enforcement.py show those on a Windows host), and the Job's settings as
re-read from the Job (they are the settings the backend applied without error).

Facts are booleans, counts and names; the attestation never holds a path, a SID or the
profile's name.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
from typing import Protocol

from stockade import __version__
from stockade.errors import StockadeError
from stockade.launch.request import LaunchRequest, LimitSpec, PathGrant
from stockade.lifecycle import facts, removers, statedir
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.lifecycle.probe import Refused, Run
from stockade.windows import constants as c
from stockade.windows import identity
from stockade.windows.acl import Dacl

PROBE_COMMAND = ("cmd.exe", "/d", "/c", "exit", "0")
# facts.PROBE_LIMITS without file_size (Windows has no such limit, see rules.py).
PROBE_LIMITS = LimitSpec(timeout=30.0, memory=facts.PROBE_MEMORY, pids=facts.PROBE_PIDS,
                         output=1 << 20)
PROTECTED, DENIED = ".git", "secret"


def _at_least(minimum: int) -> facts.Check:
    return ((lambda value: type(value) is int and value >= minimum), f"at least {minimum}")


# stage -> fact -> check; the order is the order in which stages fail.
_is = facts.exactly
EXPECTATIONS: facts.Table = {
    "identity": {"appcontainer_token": _is(True), "launch_package_sid": _is(True),
                 "capabilities": _is(0)},
    "job": {"in_job": _is(True), "job_kill_on_close": _is(True), "job_breakaway": _is(False),
            "job_die_on_unhandled_exception": _is(True), "job_ui_restrictions": _is("all")},
    "desktop": {"private_desktop": _is(True)},
    "handles": {"inherited_handles": _is("stdin, stdout, stderr")},
    # The workspace granted; `.git` made read-only and `secret` denied, each an override.
    "filesystem": {"acl_grants": _at_least(1), "acl_overrides": _at_least(2),
                   "no_low_label_images": _is(True), "extension_points_disabled": _is(True),
                   "no_remote_images": _is(True)},
    "limits": {"job_memory": _is(facts.PROBE_MEMORY), "job_active_processes": _is(facts.PROBE_PIDS),
               "timeout": _is(True)},
    "lifetime": {"profile_deleted": _is(True), "acl_restored": _is(True),
                 "ledger_settled": _is(True)},
}


class Host(Protocol):
    """What the probe asks Windows itself (a model in the tests)."""

    def elevated(self) -> bool: ...

    def dacl(self, path: str) -> Dacl: ...

    def profile_left(self, name: str) -> bool:
        """Whether an AppContainer profile `name` still existed (it is deleted now)."""


class Win32Host:
    def elevated(self) -> bool:
        from stockade.windows import tokens
        return tokens.elevated()

    def dacl(self, path: str) -> Dacl:
        from stockade.windows.aclstore import WindowsAclStore
        return WindowsAclStore().read(path)

    def profile_left(self, name: str) -> bool:
        return identity.delete_profile(name)


class WindowsProbe:
    """`PlatformProbe` for the Windows backend; `host` defaults to the real one."""

    messages = {
        "windows_too_old": "the Windows backend needs Windows 10 or later",
        "probe_command_failed": "cmd.exe /d /c exit 0 did not exit 0 in the probe sandbox "
                                "(it may not have been able to start on the private desktop)",
        "confinement_unverified": "the probe command's token or Job membership was not as "
                                  "launched; it was terminated before it ran",
        "windows_setup_failed": "a Win32 call failed while setting up the probe sandbox",
    }

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

    def storage(self) -> None:
        return None  # no boot identity is bound yet: every process probes once

    def judge(self, observed: dict[str, object]) -> None:
        facts.judge(observed, EXPECTATIONS)

    def launch(self, run: Run, ledger: Ledger) -> None:
        """Run PROBE_COMMAND in a sandbox, recording what the backend verified into `run`."""
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

        request = probe_request(top, secrets.token_hex(16))
        paths = (request.cwd, *(os.path.join(request.cwd, name) for name in (PROTECTED, DENIED)))
        for path in paths:
            os.mkdir(path, 0o700)
        before = [self.host.dacl(path) for path in paths]
        run.backend.check(request)
        result = execute(run.backend, request)
        run.enforced = result.enforced
        run.facts |= launch_facts(result.enforced)
        run.facts["exit_code"] = result.exit_code
        if result.exit_code != 0:
            raise Refused("probe_command_failed", self.messages["probe_command_failed"])
        record = os.path.basename(LaunchRecord(ledger, request.request_id).path)
        run.facts |= {
            "profile_deleted": not self.host.profile_left(
                identity.profile_name(request.request_id, set())),
            "acl_restored": [self.host.dacl(path) for path in paths] == before,
            "ledger_settled": record not in ledger.records(),
        }


def probe_request(top: str, request_id: str) -> LaunchRequest:
    """The probe's minimal request: the system root readable, a workspace in `top` writable
    with a protected and a denied name in it, network none, Job limits."""
    system_root = os.path.realpath(os.environ.get("SystemRoot", "C:\\Windows"))
    workspace = os.path.join(top, "ws")
    return LaunchRequest(
        argv=PROBE_COMMAND, cwd=workspace,
        env=(("PATH", os.path.join(system_root, "System32")), ("SystemRoot", system_root)),
        read=(PathGrant(system_root, system_root),), write=(PathGrant(workspace, workspace),),
        deny=(PathGrant(os.path.join(workspace, DENIED), os.path.join(workspace, DENIED)),),
        protected=(PROTECTED,), limits=PROBE_LIMITS, request_id=request_id)


def launch_facts(enforced: dict) -> dict[str, object]:
    """The facts of EXPECTATIONS a launch's `enforced` holds (a missing one is None), and
    `roots_open_to_every_appcontainer`, for information."""
    verified = enforced.get("verified", {})
    job = enforced.get("job", {})
    done = enforced.get("filesystem", {})
    mitigations = enforced.get("mitigations", 0)
    return {
        **{fact: verified.get(fact) for fact in EXPECTATIONS["identity"]},
        "in_job": verified.get("in_job"),
        **{f"job_{name}": job.get(name) for name in
           ("kill_on_close", "breakaway", "die_on_unhandled_exception", "ui_restrictions")},
        "private_desktop": enforced.get("desktop") == "private",
        "inherited_handles": enforced.get("handles"),
        "acl_grants": done.get("grants"), "acl_overrides": done.get("overrides"),
        "roots_open_to_every_appcontainer": done.get("roots_open_to_every_appcontainer"),
        "no_low_label_images": bool(mitigations & c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON),
        "extension_points_disabled": bool(
            mitigations & c.MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON),
        "no_remote_images": bool(mitigations & c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON),
        "job_memory": job.get("memory"), "job_active_processes": job.get("active_processes"),
        "timeout": "timeout" in enforced.get("limits", {}),
    }


def verified(observed: dict[str, object], *names: str) -> bool:
    """Whether each named fact is present in `observed` and holds (for the report)."""
    return facts.verified(observed, *names, table=EXPECTATIONS)
