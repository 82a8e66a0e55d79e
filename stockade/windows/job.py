"""The Job Object every launch runs in: what `limits` become (`job_plan`, pure), the structures
SetInformationJobObject takes (pure), and the Job itself (`create_job`, Windows).

Always: kill-on-close (the owner holds the only handle, so its death ends the tree), no breakaway
(neither BREAKAWAY_OK nor SILENT_BREAKAWAY_OK, so no descendant can leave), die on an unhandled
exception instead of waiting on an error dialog, and every UI restriction (handles of other
processes' windows, clipboard, system parameters, display settings, global atoms, desktop
switching, logging off). `memory` is a limit on the whole tree's committed memory, `pids` on the
number of live processes, `cpu` (in cores) a hard cap on the tree's share of all processors.

Windows nests a Job inside another only if neither sets UI limits ("Nested Jobs"). An owner
in a Job (a venv's python.exe, py.exe and pip's console-script launchers; runas, Task Scheduler,
some CI runners) does not always need that: a Job that lets its children break away silently
(the launchers' kill-on-close Jobs do) keeps none of them, and the sandbox's Job is then the
child's only one, UI limits and all. So they are always asked for first; only when Windows
refuses the start in a Job that has them, with the owner in a Job, does the Job drop them
(`without_ui_limits`, `set_ui_restrictions`) and the start is tried once more (handle.py). The
launch then records `ui_limits_dropped` and the report's `ui_restrictions` row says they are
not in force; the AppContainer, the private desktop and the window station's entries are
unchanged. An owner's Job that sets UI limits itself can hold no nested Job at all
(`owner_ui_restrictions`): that refuses the launch, typed (handle.py).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from stockade.errors import SetupError, UnenforceableError
from stockade.launch.request import LimitSpec
from stockade.windows import constants as c
from stockade.windows.api import win32
from stockade.windows.structs import (
    DWORD,
    HANDLE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION,
    JOBOBJECT_BASIC_UI_RESTRICTIONS,
    JOBOBJECT_CPU_RATE_CONTROL_INFORMATION,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
)

ALWAYS = (c.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | c.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION)
MAX_SIZE = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
MAX_PROCESSES = 0xFFFFFFFF
# JobMemoryLimit is in bytes (JOBOBJECT_EXTENDED_LIMIT_INFORMATION), but commitment is granted in
# pages (SYSTEM_INFO.dwPageSize: "the granularity of page protection and commitment", which is
# what mmap.PAGESIZE reads on Windows) and a Job keeps its limit in whole pages, so a limit off a
# page boundary reads back changed. The plan sets whole pages, rounded down (never more than
# asked), so what is read back is what was set whichever way Windows rounds.
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class JobPlan:
    limit_flags: int
    job_memory: int = 0
    active_processes: int = 0
    cpu_rate: int | None = None  # hundredths of a percent of all processors, 1..10000
    ui_restrictions: int = c.JOB_OBJECT_UILIMIT_ALL


def job_plan(limits: LimitSpec, cpus: int) -> JobPlan:
    """The Job for `limits` on a host with `cpus` processors, every UI restriction included;
    UnenforceableError for a limit a Job cannot express."""
    flags, memory, processes, rate = ALWAYS, 0, 0, None
    if limits.memory is not None:
        if not PAGE <= limits.memory <= MAX_SIZE:
            raise UnenforceableError("limits.memory", f"{limits.memory} bytes is out of range "
                                     f"(a Job's limit is whole pages of {PAGE} bytes)")
        flags |= c.JOB_OBJECT_LIMIT_JOB_MEMORY
        memory = limits.memory - limits.memory % PAGE
    if limits.pids is not None:
        if not 0 < limits.pids <= MAX_PROCESSES:
            raise UnenforceableError("limits.pids", f"{limits.pids} processes is out of range")
        flags |= c.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
        processes = limits.pids
    if limits.cpu is not None:
        if not limits.cpu > 0:
            raise UnenforceableError("limits.cpu", f"{limits.cpu} cores is out of range")
        if limits.cpu < cpus:
            rate = max(1, math.ceil(limits.cpu / cpus * 10000))
    return JobPlan(flags, memory, processes, rate)


def without_ui_limits(plan: JobPlan) -> JobPlan:
    """`plan` as a Job nested in the owner's can hold it: no UI restrictions."""
    return dataclasses.replace(plan, ui_restrictions=0)


def owner_ui_restrictions() -> int:
    """The UI restrictions of the Job this process is in (its immediate one, which
    QueryInformationJobObject asks about when given no handle); 0 when it sets none or cannot
    be asked."""
    try:
        return _query(None, c.JOB_OBJECT_BASIC_UI_RESTRICTIONS,
                      JOBOBJECT_BASIC_UI_RESTRICTIONS()).UIRestrictionsClass
    except OSError:
        return 0


class OwnerJob(StrEnum):
    """The Job this process is in, as far as the sandbox's Job goes (handle.py's retry)."""

    NONE = "none"  # in no Job: the sandbox's Job is the child's only one
    LETS_GO = "silent_breakaway"  # a launcher's (py.exe, a venv's python.exe): UI limits hold
    KEEPS = "keeps_children"  # runas, Task Scheduler, some CI: the Job drops its UI limits
    UI_LIMITED = "ui_limited"  # sets UI limits itself: no Job nests in it (refused)


def owner_job() -> OwnerJob:
    """What kind of Job this process is in (IsProcessInJob, then its immediate Job's limits
    and UI restrictions, QueryInformationJobObject with no handle)."""
    if not owner_in_job():
        return OwnerJob.NONE
    if owner_ui_restrictions():
        return OwnerJob.UI_LIMITED
    try:
        flags = _query(None, c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                       JOBOBJECT_EXTENDED_LIMIT_INFORMATION()).BasicLimitInformation.LimitFlags
    except OSError:
        return OwnerJob.KEEPS  # (cannot be asked: the case that keeps the fewest limits)
    return OwnerJob.LETS_GO if flags & c.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK \
        else OwnerJob.KEEPS


def owner_in_job() -> bool:
    """Whether this process is in a Job already (IsProcessInJob with no Job: any Job)."""
    api = win32()
    inside = ctypes.c_int()
    api.IsProcessInJob(api.GetCurrentProcess(), None, ctypes.byref(inside))
    return bool(inside.value)


# Never set on the sandbox's Job (create_job refuses a plan with either; handle.py refuses a
# child whose Job, read back, has either), only tested for.
_BREAKAWAY = c.JOB_OBJECT_LIMIT_BREAKAWAY_OK | c.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK
DRAIN_WAIT = 10.0  # seconds for a terminated Job's processes to be gone
_DRAIN_POLL = 0.01


def settings(extended: JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
             ui: JOBOBJECT_BASIC_UI_RESTRICTIONS,
             rate: JOBOBJECT_CPU_RATE_CONTROL_INFORMATION | None) -> dict[str, object]:
    """A Job's settings as facts (for `Handle.enforced`), from the structures that set them or
    that QueryInformationJobObject read back."""
    flags = extended.BasicLimitInformation.LimitFlags
    capped = rate is not None and rate.ControlFlags & c.JOB_OBJECT_CPU_RATE_CONTROL_ENABLE
    return {"kill_on_close": bool(flags & c.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE),
            "breakaway": bool(flags & _BREAKAWAY),
            "die_on_unhandled_exception": bool(
                flags & c.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION),
            "ui_restrictions": {c.JOB_OBJECT_UILIMIT_ALL: "all", 0: "none"}.get(
                ui.UIRestrictionsClass, f"0x{ui.UIRestrictionsClass:X}"),
            "memory": extended.JobMemoryLimit if flags & c.JOB_OBJECT_LIMIT_JOB_MEMORY else 0,
            "active_processes": extended.BasicLimitInformation.ActiveProcessLimit
            if flags & c.JOB_OBJECT_LIMIT_ACTIVE_PROCESS else 0,
            "cpu_rate": rate.CpuRate if capped else None}


def applied(plan: JobPlan) -> dict[str, object]:
    """What a Job created from `plan` must be found to be set to."""
    return settings(extended_limits(plan), ui_restrictions(plan), cpu_rate(plan))


def drained(active: Callable[[], int], wait: float = DRAIN_WAIT, *,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether a terminated Job's process count (`active`) reached 0 within `wait` seconds.
    TerminateJobObject only starts the termination; a process counts until it has exited and
    every reference to it is released, so its storage and DACLs are let go only then."""
    deadline = clock() + wait
    while active():
        if clock() >= deadline:
            return False
        sleep(_DRAIN_POLL)
    return True


def extended_limits(plan: JobPlan) -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION:
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    info.BasicLimitInformation.LimitFlags = plan.limit_flags
    info.BasicLimitInformation.ActiveProcessLimit = plan.active_processes
    info.JobMemoryLimit = plan.job_memory
    return info


def cpu_rate(plan: JobPlan) -> JOBOBJECT_CPU_RATE_CONTROL_INFORMATION | None:
    if plan.cpu_rate is None:
        return None
    return JOBOBJECT_CPU_RATE_CONTROL_INFORMATION(
        ControlFlags=c.JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | c.JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP,
        CpuRate=plan.cpu_rate)


def ui_restrictions(plan: JobPlan) -> JOBOBJECT_BASIC_UI_RESTRICTIONS:
    return JOBOBJECT_BASIC_UI_RESTRICTIONS(UIRestrictionsClass=plan.ui_restrictions)


def create_job(plan: JobPlan) -> int:
    """A new, unnamed Job with `plan` applied; the caller owns (and must close) the handle.
    A plan letting a process break away is refused before any Job exists: with
    BREAKAWAY_OK a child created with CREATE_BREAKAWAY_FROM_JOB leaves the Job, and its limits
    and UI restrictions with it (SILENT_BREAKAWAY_OK: every child does)."""
    if plan.limit_flags & _BREAKAWAY:
        raise SetupError("job_breakaway", "the sandbox's Job would let its processes break "
                         "away; it is never made so", stage="job_desktop")
    api = win32()
    handle = api.CreateJobObjectW(None, None)
    try:
        settings = [(c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION, extended_limits(plan)),
                    (c.JOB_OBJECT_BASIC_UI_RESTRICTIONS, ui_restrictions(plan))]
        rate = cpu_rate(plan)
        if rate is not None:
            settings.append((c.JOB_OBJECT_CPU_RATE_CONTROL_INFORMATION, rate))
        for info_class, info in settings:
            api.SetInformationJobObject(handle, info_class, ctypes.byref(info),
                                        ctypes.sizeof(info))
    except BaseException:
        api.CloseHandle(handle)
        raise
    return handle


def assign_only(handle: int) -> int:
    """An inheritable duplicate of the Job's handle that may do one thing, put a process in it
    (JOB_OBJECT_ASSIGN_PROCESS: what PROC_THREAD_ATTRIBUTE_JOB_LIST needs), never change,
    query or terminate it: the broker's (broker.py). The caller closes it."""
    api = win32()
    copy = HANDLE()
    api.DuplicateHandle(api.GetCurrentProcess(), handle, api.GetCurrentProcess(),
                        ctypes.byref(copy), c.JOB_OBJECT_ASSIGN_PROCESS, True, 0)
    return copy.value


def set_ui_restrictions(handle: int, plan: JobPlan) -> None:
    """Set the (still empty) Job's UI restrictions to `plan`'s."""
    info = ui_restrictions(plan)
    win32().SetInformationJobObject(handle, c.JOB_OBJECT_BASIC_UI_RESTRICTIONS,
                                    ctypes.byref(info), ctypes.sizeof(info))


def observed(handle: int) -> dict[str, object]:
    """The Job's settings as QueryInformationJobObject reads them back (`settings`)."""
    extended = _query(handle, c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                      JOBOBJECT_EXTENDED_LIMIT_INFORMATION())
    ui = _query(handle, c.JOB_OBJECT_BASIC_UI_RESTRICTIONS, JOBOBJECT_BASIC_UI_RESTRICTIONS())
    rate = _query(handle, c.JOB_OBJECT_CPU_RATE_CONTROL_INFORMATION,
                  JOBOBJECT_CPU_RATE_CONTROL_INFORMATION())
    return settings(extended, ui, rate)


def active_processes(handle: int) -> int:
    """How many processes the Job still holds (JobObjectBasicAccountingInformation)."""
    return _query(handle, c.JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION,
                  JOBOBJECT_BASIC_ACCOUNTING_INFORMATION()).ActiveProcesses


def _query(handle: int | None, info_class: int, info: ctypes.Structure):
    win32().QueryInformationJobObject(handle, info_class, ctypes.byref(info),
                                      ctypes.sizeof(info), ctypes.byref(DWORD()))
    return info
