"""WindowsHandle: one launch on Windows, from setup to settlement.

A launch, in order (each durable step recorded in the launch ledger before it happens, every
step undone at settlement, newest first):

1. identity: the AppContainer profile named from the request id (identity.py);
2. filesystem: the ACE plan applied for that AppContainer (filesystem.py);
3. a Job with the launch's limits (job.py), an entry for the AppContainer on this process's
   window station and a private desktop with a bounded heap (desktop.py);
4. the child created suspended in its AppContainer, already in the Job, inheriting exactly its
   three standard handles (process.py), by a one-shot broker process of its own that launches
   only what a closed manifest bound to its PID, a nonce and the request's digest authorizes
   (brokered.py, broker.py); then verified from what is read back, not from what
   was asked for — its token and Job membership (tokens.py), the Job's settings
   (QueryInformationJobObject), the handles it holds (an inheritable canary outside the handle
   list must not be among them), its mitigation policies, the desktop's and window station's
   entries — or the Job is terminated and the launch fails; then, for network `allowlist` or
   `any`, fenced by the egress fence service (netfence.py: the proxy on the host, started
   before the child, and the service's exemption and filters), and resumed.

When the child exits, the Job is terminated (so nothing it started outlives it, as on Linux when
the sandbox's pid 1 exits) and drained — a bounded wait until it holds no process, since a
terminated process still holds its files until it is gone — and the launch settles: the fence
given back and the proxy stopped, desktop and Job closed, window-station entry removed, DACLs
reverted, profile deleted. A Job that does not
drain settles nothing (`job_not_drained`): the ledger record is left for the next reconcile.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from stockade.errors import SetupError, StartError, StockadeError
from stockade.launch.backend import Exit, Handle, Stdio
from stockade.launch.request import LaunchRequest
from stockade.windows import (
    acl,
    brokered,
    desktop,
    filesystem,
    fsinfo,
    identity,
    job,
    leases,
    netfence,
    process,
    program,
    records,
    standing,
    tokens,
)
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.aclstore import WindowsAclStore
from stockade.windows.api import win32
from stockade.windows.manifest import Context
from stockade.windows.stdio import ChildStdio
from stockade.windows.structs import DWORD

if TYPE_CHECKING:
    from stockade.lifecycle.ledger import LaunchRecord, Ledger

T = TypeVar("T")
KILLED_SIGNAL = 9  # how a killed sandbox is reported, as on Linux (SIGKILL)
_WAIT_SLICE_MS = 100
# CreateProcessW failures that are the command's, not the sandbox's: file or path not found,
# access denied (the image is outside what the AppContainer may execute), not a valid image.
_NOT_STARTABLE = {2, 3, c.ERROR_ACCESS_DENIED, 193, 216}


def start(create: Callable[[], T], job_handle: int, plan: job.JobPlan, nested: bool,
          program: str) -> tuple[T, job.JobPlan]:
    """Create the child (`create`: through the broker) in the launch's Job (`job_handle`, set
    as `plan`); what `create` gave, and the plan the Job holds once it started. With the owner
    in a Job (`nested`) Windows refuses to start the child in a Job with UI limits (access
    denied) unless the owner's Job lets its children break away silently, as Python's
    launchers' Jobs do: then, and only then, the Job drops them and the start is tried once
    more, by a broker of its own (see job.py). A failure, typed (`start_failure`) where it is
    the command's or the owner's Job's."""
    try:
        try:
            return create(), plan
        except OSError as exc:
            if not (nested and plan.ui_restrictions and exc.winerror == c.ERROR_ACCESS_DENIED):
                raise
        plan = job.without_ui_limits(plan)
        job.set_ui_restrictions(job_handle, plan)
        return create(), plan
    except OSError as exc:
        typed = start_failure(exc, program, job.owner_ui_restrictions() if nested else 0)
        if typed is not None:
            raise typed from None
        raise


def start_failure(exc: OSError, program: str, owner_ui_limits: int = 0) -> StockadeError | None:
    """What a failed CreateProcessW says, typed; None for a failure of the sandbox's own.
    `owner_ui_limits`: the UI restrictions of the Job the owner is in (0: none, or no Job).
    Windows nests no Job in one that sets UI limits, so access denied there refuses the launch
    (70); otherwise (a Job without UI limits was refused too) it is the command's: the
    AppContainer may not run its image (71)."""
    if exc.winerror == c.ERROR_ACCESS_DENIED and owner_ui_limits:
        return SetupError("owner_job_not_nestable", "this process is in a Job that sets UI "
                          "limits, and Windows nests no Job inside such a Job, so the sandbox's "
                          "Job could not hold the command; run Stockade from a process outside "
                          "that Job", stage="start")
    if exc.winerror in _NOT_STARTABLE:
        return StartError("command_not_started", f"{program}: {exc.strerror}")
    return None


class WindowsHandle(Handle):
    """A launch in progress; `ledger` is the launch ledger (default: the state directory's)."""

    def __init__(self, request: LaunchRequest, stdio: Stdio,
                 ledger: Ledger | None = None) -> None:
        self.stages: list[tuple[str, float]] = [("spawn", time.monotonic())]
        self.enforced: dict = {}
        self.violations: list = []
        self.network_log: list = []
        self._lock = threading.Lock()
        self._waiting = threading.Lock()  # held by the one wait() asking or settling
        self._killed = False
        self._exit: Exit | None = None
        self._job: int | None = None
        self._process: int | None = None
        self._pipes: ChildStdio | None = None
        self._network: netfence.LaunchNetwork | None = None
        self._kept_leases: contextlib.ExitStack | None = None
        self._stack = contextlib.ExitStack()
        self._stage = "identity"
        try:
            self._launch(request, stdio, ledger)
        except BaseException as exc:
            self._close()
            if self._pipes is not None:
                self._pipes.close()
            if isinstance(exc, OSError):  # a Win32 call failed: typed, naming no path or SID
                raise SetupError("windows_setup_failed", f"the {self._stage} stage failed: "
                                 f"{exc.strerror or exc.__class__.__name__}",
                                 stage=self._stage) from exc
            raise

    def _launch(self, request: LaunchRequest, stdio: Stdio, ledger: Ledger | None) -> None:
        from stockade.lifecycle.ledger import Ledger

        api = win32()
        program.executable(request)  # (the command's to find: before anything is set up)
        ledger = ledger or Ledger()
        held = self._stack.enter_context(contextlib.ExitStack())  # released after the ledger
        record = self._stack.enter_context(ledger.launch(request.request_id))
        name = identity.profile_name(request.request_id, ledger.retired())
        package = identity.derive_sid(name)
        record.add(records.PROFILE_KIND, name)
        if identity.create_profile(name).upper() != package.upper():
            raise SetupError("appcontainer_mismatch", "the new profile's SID is not the one "
                             "derived from its name", stage="identity")
        temp = os.path.join(identity.folder(package), "Temp")  # removed with the profile
        os.makedirs(temp, exist_ok=True)
        self.stages.append(("identity", time.monotonic()))
        self._stage = "filesystem"
        user = tokens.current_user_sid()
        prepared = filesystem.prepare(
            request, package, record, WindowsAclStore(), fsinfo,
            functools.partial(leases.briefly, user),
            lambda path: leases.hold(user, path, held), standing.StandingGrants(), user)
        done = prepared.counts
        self.stages.append(("filesystem", time.monotonic()))
        self._stage = "job_desktop"
        nested = job.owner_in_job()
        plan = job.job_plan(request.limits, os.cpu_count() or 1)
        self._job = job.create_job(plan)
        self._stack.callback(api.CloseHandle, self._job)
        assign = job.assign_only(self._job)  # (the broker's)
        self._stack.callback(api.CloseHandle, assign)
        station = desktop.window_station()
        desktop.check_station(station)
        record.add(desktop.STATION_KIND, station, {"sid": package})
        with leases.briefly(user, records.station_lock(station)):
            station_aces = desktop.change_station(
                station, functools.partial(desktop.station_granted, sid=package))
        desk = desktop.desktop_name()
        desk_handle = desktop.create_desktop(desk, desktop.desktop_sddl(user, package))
        self._stack.callback(api.CloseDesktop, desk_handle)
        # The proxy and the fence (network modes past "none") go once the Job has drained.
        network = self._network = self._stack.enter_context(netfence.LaunchNetwork(request))
        capabilities = prepared.capabilities + network.capabilities
        # Runs once the child's handles are closed, before the desktop and the record go.
        self._stack.callback(self._drain, self._job, record, held)
        desk_aces = desktop.object_aces(desk_handle)
        seen_desktop = {"name": desk, "appcontainer_rights": acl.allowed(desk_aces, package),
                        "every_appcontainer_rights": acl.allowed(desk_aces, sids.ALL_APP_PACKAGES),
                        "station_rights": acl.allowed(station_aces, package)}
        self.stages.append(("job_desktop", time.monotonic()))
        self._stage = "start"
        pipes = ChildStdio(stdio)
        self._pipes = pipes
        wanted_mitigations = process.mitigations(request.exec_from_write)
        context = Context(package_sid=package, capabilities=prepared.capabilities,
                          desktop=f"{station}\\{desk}", temp=temp, job=assign,
                          stdio=tuple(pipes.handles))
        manifests = brokered.directory(ledger.root)
        # What the broker launches: the request with this launch's proxy in its environment
        # (the broker adds the network's capability from the request itself: netfence).
        launched = dataclasses.replace(request, env=network.environment(request.env))
        canary = process.inheritable_canary()
        try:
            started, plan = start(
                functools.partial(brokered.create, launched, context, manifests, user, record),
                self._job, plan, nested, request.argv[0])
            created = started.created
            self._process = created.process
            self._stack.callback(api.CloseHandle, created.process)
            self._stack.callback(api.CloseHandle, created.thread)
            held_handles = process.holds(created.process, (*pipes.handles, canary))
        finally:
            api.CloseHandle(canary)
            pipes.close_child_ends()
        seen = {"token": tokens.child_token(created.process, self._job),
                "job": job.observed(self._job), "handles": held_handles,
                "mitigations": process.observed_mitigations(created.process),
                "desktop": seen_desktop,
                "broker": {"pid": started.broker_pid,
                           "creator": process.creator(created.process),
                           "manifest_consumed": started.manifest_consumed}}
        refusal = confinement_refusal(package, plan, wanted_mitigations, seen, capabilities)
        if refusal:
            raise SetupError("confinement_unverified", refusal, stage="verify")
        fenced = network.attach(name, created.pid)  # before the child's first instruction
        if api.ResumeThread(created.thread) == 0xFFFFFFFF:
            raise SetupError("resume_failed", "the child could not be resumed", stage="start")
        pipes.start_relays()
        self.stdin, self.stdout, self.stderr = pipes.files
        self.enforced = _enforced(request, plan, done, seen, package, capabilities) | {
            "owner_in_job": nested, "ui_limits_dropped": not plan.ui_restrictions} | fenced
        self.stages.append(("start", time.monotonic()))

    def _drain(self, job_handle: int, record: LaunchRecord, held: contextlib.ExitStack) -> None:
        """Wait (bounded) until the terminated Job holds no process. Until then a process may
        still hold files open in the roots and the profile's storage, so if it does not drain,
        nothing is undone now: the record is left for the next reconcile (and the leases on
        overridden paths kept until this process ends)."""
        try:
            if job.drained(functools.partial(job.active_processes, job_handle)):
                return
        except OSError:
            pass  # the Job cannot be asked: as if it had not drained
        record.abandon()
        self._kept_leases = held.pop_all()
        raise SetupError("job_not_drained", "the sandbox's processes did not all exit within "
                         f"{job.DRAIN_WAIT:g}s of being terminated; what the launch changed is "
                         "left to the next reconcile", stage="settle")

    def wait(self, timeout: float | None = None) -> Exit | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # One waiter at a time: the process handle is waited on, and closed by settlement,
            # under this lock, so a second caller never waits on a closed (or reused) handle
            # value, never settles twice, and gets the one Exit that settlement made.
            if not self._waiting.acquire(timeout=-1 if left is None else left):
                return None  # another caller is settling the launch: not over yet
            try:
                if self._exit is not None:
                    return self._exit
                step = _WAIT_SLICE_MS if left is None else min(_WAIT_SLICE_MS, int(left * 1000))
                if win32().WaitForSingleObject(self._process, step) == c.WAIT_OBJECT_0:
                    return self._settle()
            finally:
                self._waiting.release()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _settle(self) -> Exit:
        code = DWORD()
        win32().GetExitCodeProcess(self._process, ctypes.byref(code))
        failure = self._close()
        if self._network is not None:
            self.network_log = self._network.denials()
        self.stages.append(("settle", time.monotonic()))
        self._exit = Exit(None, KILLED_SIGNAL, failure) if self._killed \
            else Exit(code.value, None, failure)
        return self._exit

    def kill(self) -> None:
        with self._lock:
            if not self._killed and self._job is not None:
                self._killed = True
                with contextlib.suppress(OSError):
                    win32().TerminateJobObject(self._job, 1)

    def _close(self) -> StockadeError | None:
        """End the tree, then undo the launch; the settlement failure, if any."""
        with self._lock:
            job_handle, self._job = self._job, None  # kill() does nothing from here on
            if job_handle is not None:
                with contextlib.suppress(OSError):
                    win32().TerminateJobObject(job_handle, 1)
            if self._pipes is not None:
                self._pipes.join_relays()
            try:
                self._stack.close()
            except StockadeError as exc:
                return exc
            return None


def confinement_refusal(package: str, plan: job.JobPlan, mitigations: int,
                        seen: dict, capabilities: tuple[str, ...] = ()) -> str | None:
    """Why the suspended child is not confined as launched, from what was read back (`seen`:
    its token, its creator, the Job's settings, the handles it holds, its mitigation policies,
    the desktop's and window station's entries); None if it is."""
    token: tokens.ChildToken = seen["token"]
    desk = seen["desktop"]
    broker = seen["broker"]
    return (token.refusal(package, capabilities) or process.handles_refusal(seen["handles"])
            # Made by the launch's broker, a process of its own: not by this one, nor another.
            or (None if broker["creator"] == broker["pid"] != os.getpid()
                else "the child was not created by the launch's broker")
            # Whatever the plan said: a Job that lets a process break away does not hold it.
            or ("the Job lets its processes break away" if seen["job"]["breakaway"] else None)
            or (None if seen["job"] == job.applied(plan)
                else "the Job does not hold the settings it was given")
            # At least those asked for: Exploit Protection's system and per-program settings
            # (Set-ProcessMitigation) may switch on more, e.g. BlockLowLabelImageLoads for
            # python.exe, which only confines the child further.
            or (None if seen["mitigations"] & mitigations == mitigations
                else "the child's mitigation policies lack some of the ones asked for")
            or (None if (desk["appcontainer_rights"], desk["every_appcontainer_rights"],
                         desk["station_rights"]) == (desktop.APPCONTAINER_RIGHTS, 0,
                                                     desktop.STATION_RIGHTS)
                else "the desktop or window station does not grant what was asked for"))


def _enforced(request: LaunchRequest, plan: job.JobPlan, done: dict[str, int], seen: dict,
              package: str, capabilities: tuple[str, ...] = ()) -> dict:
    """What this launch enforced, as read back from the suspended child and its Job, desktop
    and window station (`seen`, as `confinement_refusal` took it); the readiness probe judges
    these next to what its child reports from inside (see probe.py)."""
    held = seen["handles"]
    limits = {"timeout": "wall clock; the Job is terminated"} \
        if request.limits.timeout is not None else {}
    if plan.job_memory:
        limits["memory"] = "Job memory limit (whole tree)"
    if plan.active_processes:
        limits["pids"] = "Job active-process limit (processes)"
    if plan.cpu_rate is not None:
        limits["cpu"] = f"Job CPU rate hard cap ({plan.cpu_rate / 100:g}% of all processors)"
    return {"identity": "appcontainer", "capabilities": len(capabilities),
            "verified": seen["token"].facts(package, capabilities), "filesystem": done,
            "exec_from_write": request.exec_from_write, "mitigations": seen["mitigations"],
            "job": seen["job"], "desktop": seen["desktop"], "broker": seen["broker"],
            "handles": {"standard": sum(held[:3]), "outside_list": sum(held[3:])},
            "limits": limits}
