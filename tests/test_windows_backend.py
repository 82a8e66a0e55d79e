"""The Windows backend's contract on any platform: inert imports, a typed unavailable reason
off Windows, what `check` refuses, the report, and the launch's pure plans (Job limits, private
desktop security descriptor, mitigation policy, the token verdict)."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import subprocess
import sys
from dataclasses import replace

import pytest
from test_windows_fakes import (
    LAUNCHER_JOB,
    PACKAGE,
    PLAIN_JOB,
    UI_LIMITED_JOB,
    USER,
    FakeWin32,
    bind_win32,
    win32_error,
)

import stockade.windows
from stockade.errors import SetupError, StartError, UnavailableError, UnenforceableError
from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.windows import constants as c
from stockade.windows import desktop, handle, job, process, rules, tokens
from stockade.windows.backend import REPORT, WindowsBackend

BREAKAWAY_OK, SILENT_BREAKAWAY_OK = 0x800, 0x1000
not_windows = pytest.mark.not_windows  # (checks the non-Windows side)


def base(**changes) -> LaunchRequest:
    request = LaunchRequest(
        argv=("C:\\py\\python.exe", "-c", "print(1)"), cwd="C:\\ws",
        env=(("PATH", "C:\\py"), ("SystemRoot", "C:\\Windows")),
        read=(PathGrant("C:\\py", "C:\\py"),), write=(PathGrant("C:\\ws", "C:\\ws"),),
        protected=(".git",))
    return replace(request, **changes)


@not_windows
def test_importing_every_module_of_the_package_does_nothing_off_windows():
    names = [f"stockade.windows.{m.name}" for m in pkgutil.iter_modules(stockade.windows.__path__)]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({n!r})\n" for n in names) \
        + "print(sorted(m for m in sys.modules if m in ('msvcrt', '_winapi', 'winreg')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]" and len(names) >= 20
    for name in names:
        importlib.import_module(name)


@not_windows
def test_the_probe_says_the_backend_runs_only_on_windows():
    with pytest.raises(UnavailableError) as refused:
        WindowsBackend().probe()
    assert refused.value.code == "backend_unavailable"
    assert "only on Windows" in refused.value.message


@not_windows
def test_spawning_off_windows_fails_typed_before_touching_anything(tmp_path):
    with pytest.raises(UnavailableError):
        WindowsBackend().spawn(base(), None)


def test_a_request_within_what_windows_enforces_passes_check():
    rules.check(base(exec_from_write=True, limits=LimitSpec(timeout=5, memory=1 << 30, cpu=1.5,
                                                             pids=64, output=1 << 20)))


@pytest.mark.parametrize(("changes", "capability"), [
    ({"network": NetworkSpec("allowlist", ("pypi.org",))}, "network.allowlist"),
    ({"network": NetworkSpec("any")}, "network.any"),
    ({"limits": LimitSpec(file_size=1 << 30)}, "limits.file_size"),
    ({"limits": LimitSpec(memory=1 << 70)}, "limits.memory"),
    ({"limits": LimitSpec(pids=1 << 33)}, "limits.pids"),
    ({"limits": LimitSpec(cpu=0.0)}, "limits.cpu"),
    ({"read": (PathGrant("\\\\server\\share", "\\\\server\\share"),)}, "filesystem.path"),
    ({"write": (PathGrant("\\\\?\\C:\\ws", "\\\\?\\C:\\ws"),)}, "filesystem.path"),
    ({"deny": (PathGrant("C:\\ws\\NUL", "C:\\ws\\NUL"),)}, "filesystem.path"),
    ({"read": (PathGrant("C:\\PROGRA~1\\py", "C:\\PROGRA~1\\py"),)}, "filesystem.path"),
    ({"cwd": "C:\\elsewhere"}, "process.cwd"),
    ({"cwd": "C:\\ws\\x:stream"}, "filesystem.path"),
    ({"protected": ("a\\b",)}, "filesystem.protected"),
    ({"protected": ("..",)}, "filesystem.protected"),
    ({"argv": ('C:\\py\\"python".exe',)}, "process.argv"),
    ({"env": (("PATH", "x"), ("Path", "y"))}, "env"),
    ({"env": (("=C:", "C:\\"),)}, "env"),
])
def test_what_windows_cannot_enforce_is_refused_with_the_capability(changes, capability):
    with pytest.raises(UnenforceableError) as refused:
        rules.check(base(**changes))
    assert refused.value.capability == capability
    assert refused.value.code == f"unenforceable:{capability}"


def test_a_working_directory_longer_than_windows_keeps_one_is_refused_typed():
    # (WINREAD 5) SetCurrentDirectoryW and CreateProcessW's lpCurrentDirectory take MAX_PATH
    # (260 with a final backslash and the NUL) whatever LongPathsEnabled says; past it the
    # child would not start, reported as 71 after everything was set up.
    deep = "C:\\ws\\" + "\\".join(["d" * 50] * 5)
    assert len(deep) == 260
    with pytest.raises(UnenforceableError) as refused:
        rules.check(base(cwd=deep))
    assert refused.value.capability == "process.cwd" and "258" in refused.value.message
    rules.check(base(cwd=deep[:rules.CWD_LIMIT].rstrip("\\")))


def test_exec_from_write_false_is_enforced_not_refused():
    rules.check(base(exec_from_write=False))
    assert process.mitigations(False) & c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON
    assert not process.mitigations(True) & c.MITIGATION_IMAGE_LOAD_NO_LOW_LABEL_ALWAYS_ON
    for exec_from_write in (False, True):
        policy = process.mitigations(exec_from_write)
        assert policy & c.MITIGATION_EXTENSION_POINT_DISABLE_ALWAYS_ON
        assert policy & c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON


def test_the_report_marks_what_is_not_enforced_and_never_claims_the_refused():
    rows = {row.name: row for row in REPORT}
    for refused in ("network.allowlist", "network.any", "limits.file_size"):
        assert rows[refused].enforced is False
    for held in ("identity", "filesystem.read", "filesystem.write", "filesystem.deny",
                 "filesystem.protected", "filesystem.exec_from_write", "kill_on_close",
                 "desktop", "limits.memory", "limits.pids", "limits.cpu", "limits.timeout"):
        assert rows[held].enforced is True
    assert "ALL APPLICATION PACKAGES" in rows["filesystem.read"].detail
    assert WindowsBackend().report() == REPORT


def test_the_report_agrees_with_check():
    for name, request in (("network.allowlist", base(network=NetworkSpec("allowlist"))),
                          ("network.any", base(network=NetworkSpec("any"))),
                          ("limits.file_size", base(limits=LimitSpec(file_size=1)))):
        with pytest.raises(UnenforceableError):
            rules.check(request)
        assert not {row.name: row for row in REPORT}[name].enforced


def started(monkeypatch, owner_jobs: tuple, image_denied: bool = False):
    """A child started as a launch starts it (handle.start) by a process in `owner_jobs` (its
    Jobs, the immediate one first); the Job's handle, the child's Jobs and the plan the Job
    holds."""
    fake = FakeWin32()
    fake.owner_jobs, fake.image_denied = owner_jobs, image_denied
    bind_win32(monkeypatch, fake, job, process)
    plan = job.job_plan(LimitSpec(memory=1 << 20), cpus=8)
    job_handle = job.create_job(plan)
    launch = process.Launch(
        application="C:\\py\\python.exe", command_line="python -c pass",
        environment="SystemRoot=C:\\Windows\0\0", cwd="C:\\ws",
        desktop="WinSta0\\stockade-0", package_sid=PACKAGE, job=job_handle,
        stdio=(0x10, 0x14, 0x18), mitigations=process.mitigations(False))
    created, held = handle.start(functools.partial(process.create, launch), job_handle, plan,
                                 job.owner_in_job(), "python")
    assert job.observed(job_handle) == job.applied(held)  # (what verification requires)
    # Issue 31, item 6: the child's desktop is named, the launch's private one on this station,
    # also on the retry without UI limits; never NULL (the starter's desktop, which
    # CreateProcessWithLogonW's documentation leaves to the application to grant).
    assert fake.desktops == ["WinSta0\\stockade-0"] * len(fake.created)
    return job_handle, fake.created, held


@pytest.mark.parametrize("owner_jobs", [(), (LAUNCHER_JOB,)], ids=["no-job", "launcher"])
def test_an_owner_whose_job_lets_its_children_go_keeps_every_ui_limit(monkeypatch, owner_jobs):
    """WINREAD 1: a venv's python.exe, py.exe and pip's console-script .exe run the
    interpreter in a Job whose children break away silently; the sandbox's Job is then the
    child's only one and may keep its UI limits. Before, any Job around the owner dropped
    them (and the first-run checklist failed for every venv user)."""
    job_handle, created, held = started(monkeypatch, owner_jobs)
    assert held.ui_restrictions == c.JOB_OBJECT_UILIMIT_ALL
    assert job.observed(job_handle)["ui_restrictions"] == "all"
    assert created == [(job_handle,)]  # in the sandbox's Job alone


@pytest.mark.parametrize("owner_jobs", [(PLAIN_JOB,), (LAUNCHER_JOB, PLAIN_JOB)],
                         ids=["runas", "launcher-under-runas"])
def test_an_owner_whose_job_keeps_its_children_gets_a_nested_job_without_ui_limits(
        monkeypatch, owner_jobs):
    """Issue 31, D4 ("nested ... if neither job sets UI limits"): refused with them, the start
    is tried once more in the same Job without them, and it is seen so."""
    job_handle, created, held = started(monkeypatch, owner_jobs)
    assert held.ui_restrictions == 0 and job.observed(job_handle)["ui_restrictions"] == "none"
    assert held == job.without_ui_limits(job.job_plan(LimitSpec(memory=1 << 20), cpus=8))
    assert len(created) == 1 and created[0][:2] == (job_handle, PLAIN_JOB)  # nested in it


def test_an_owners_job_with_ui_limits_of_its_own_refuses_the_launch_typed(monkeypatch):
    with pytest.raises(SetupError) as refused:
        started(monkeypatch, (UI_LIMITED_JOB,))
    assert refused.value.code == "owner_job_not_nestable" and refused.value.exit_code == 70
    assert "UI limits" in refused.value.message


@pytest.mark.parametrize("owner_jobs", [(), (LAUNCHER_JOB,), (PLAIN_JOB,)],
                         ids=["no-job", "launcher", "runas"])
def test_an_image_the_appcontainer_may_not_run_is_the_commands_whoever_the_owner(
        monkeypatch, owner_jobs):
    """WINREAD 1: access denied with the owner in a Job was always read as the Job refusing
    to nest (70); without UI limits that cannot be so: the command could not start (71)."""
    with pytest.raises(StartError) as refused:
        started(monkeypatch, owner_jobs, image_denied=True)
    assert refused.value.code == "command_not_started" and refused.value.exit_code == 71


def test_other_start_failures_are_typed_as_the_commands_or_left_to_the_sandbox():
    missing = handle.start_failure(win32_error(2, "CreateProcessW"), "x.exe")
    assert isinstance(missing, StartError) and missing.code == "command_not_started"
    assert handle.start_failure(win32_error(8, "CreateProcessW"), "x.exe") is None
    denied = handle.start_failure(win32_error(5, "CreateProcessW"), "x.exe",
                                  c.JOB_OBJECT_UILIMIT_ALL)
    assert isinstance(denied, SetupError) and denied.code == "owner_job_not_nestable"


def test_the_owners_job_is_found_and_its_ui_limits_read(monkeypatch):
    fake = FakeWin32()
    bind_win32(monkeypatch, fake, job)
    assert job.owner_in_job() is False and job.owner_ui_restrictions() == 0
    fake.owner_jobs = (UI_LIMITED_JOB,)
    assert job.owner_in_job() is True
    assert job.owner_ui_restrictions() == c.JOB_OBJECT_UILIMIT_ALL
    fake.owner_jobs = (LAUNCHER_JOB,)
    assert job.owner_ui_restrictions() == 0


def test_the_kind_of_the_owners_job_is_typed(monkeypatch):
    """Issue 31, item 8: the kept probe result was keyed by a bool, "in a Job", which a
    launcher's Job (its children leave it: the sandbox's UI limits hold) and runas's (it keeps
    them: the limits are dropped) share."""
    fake = FakeWin32()
    bind_win32(monkeypatch, fake, job)
    for owners, kind in (((), job.OwnerJob.NONE), ((LAUNCHER_JOB,), job.OwnerJob.LETS_GO),
                         ((PLAIN_JOB,), job.OwnerJob.KEEPS),
                         ((UI_LIMITED_JOB,), job.OwnerJob.UI_LIMITED)):
        fake.owner_jobs = owners
        assert job.owner_job() is kind and isinstance(kind.value, str)


def test_every_job_kills_on_close_never_allows_breakaway_and_restricts_the_ui():
    plan = job.job_plan(LimitSpec(), cpus=8)
    assert plan.limit_flags == c.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE \
        | c.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION
    assert not plan.limit_flags & (BREAKAWAY_OK | SILENT_BREAKAWAY_OK)
    assert plan.ui_restrictions == 0xFF and plan.cpu_rate is None
    info = job.extended_limits(plan)
    assert info.BasicLimitInformation.LimitFlags == plan.limit_flags
    assert (info.JobMemoryLimit, info.BasicLimitInformation.ActiveProcessLimit) == (0, 0)
    assert job.ui_restrictions(plan).UIRestrictionsClass == 0xFF
    assert job.cpu_rate(plan) is None


def test_limits_map_to_job_memory_active_processes_and_a_hard_cpu_cap():
    plan = job.job_plan(LimitSpec(memory=2 << 30, pids=512, cpu=1.0, timeout=60,
                                  output=1 << 20), cpus=8)
    info = job.extended_limits(plan)
    flags = info.BasicLimitInformation.LimitFlags
    assert flags & c.JOB_OBJECT_LIMIT_JOB_MEMORY and info.JobMemoryLimit == 2 << 30
    assert flags & c.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
    assert info.BasicLimitInformation.ActiveProcessLimit == 512
    rate = job.cpu_rate(plan)
    assert rate.ControlFlags == c.JOB_OBJECT_CPU_RATE_CONTROL_ENABLE \
        | c.JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP
    assert rate.CpuRate == 1250  # one core of eight: 12.5 %, in hundredths of a percent


@pytest.mark.parametrize(("cores", "cpus", "rate"), [
    (0.5, 4, 1250), (1.0, 3, 3334), (0.0001, 64, 1), (3.99, 4, 9975), (4.0, 4, None),
    (16.0, 4, None),
])
def test_cpu_rates_round_up_and_a_limit_of_every_processor_needs_no_cap(cores, cpus, rate):
    assert job.job_plan(LimitSpec(cpu=cores), cpus).cpu_rate == rate


def test_the_desktop_grants_system_the_user_and_the_appcontainer_minimal_rights_at_low():
    sddl = desktop.desktop_sddl(USER, PACKAGE)
    assert sddl == (f"D:P(A;;GA;;;S-1-5-18)(A;;GA;;;{USER})(A;;0x20087;;;{PACKAGE})"
                    "S:(ML;;NW;;;LW)")
    rights = desktop.APPCONTAINER_RIGHTS
    assert rights & (0x8 | 0x10 | 0x20 | 0x40 | 0x100) == 0  # hooks, journals, enum, switch
    assert rights & 0x40000 == 0 and rights & 0x80000 == 0  # WRITE_DAC, WRITE_OWNER


@pytest.mark.parametrize(("user", "package"), [
    (USER, USER), (USER, "S-1-15-2-1"), ("S-1-5-18)(A;;GA;;;WD", PACKAGE),
    (USER, PACKAGE + ")(A;;GA;;;WD"),
])
def test_only_real_sids_and_a_package_sid_reach_the_desktop_sddl(user, package):
    with pytest.raises(ValueError):
        desktop.desktop_sddl(user, package)


def test_desktop_names_are_random_per_launch():
    names = {desktop.desktop_name() for _ in range(100)}
    assert len(names) == 100 and all(n.startswith("stockade-") for n in names)


@pytest.mark.parametrize(("facts", "verdict"), [
    ((True, True, PACKAGE, ()), None),
    ((True, True, PACKAGE.lower(), ()), None),
    ((False, True, PACKAGE, ()), "not in the launch's Job"),
    ((True, False, "", ()), "not an AppContainer token"),
    ((True, True, PACKAGE[:-1] + "0", ()), "not the launch's"),
    ((True, True, PACKAGE, ("S-1-15-3-1",)), "capabilities"),  # (internetClient)
])
def test_a_child_is_resumed_only_in_its_job_appcontainer_with_no_capabilities(facts, verdict):
    got = tokens.token_refusal(*facts, expected_sid=PACKAGE)
    assert got == verdict if verdict is None else verdict in got


RUNTIME = "S-1-15-3-1024-1-2-3-4-5-6-7-8"


@pytest.mark.parametrize(("held", "verdict"), [
    ((RUNTIME,), None), ((RUNTIME.lower(),), None), ((), "capabilities"),
    ((RUNTIME, "S-1-15-3-1"), "capabilities"), (("S-1-15-3-1024-1-2-3-4-5-6-7-9",), "capabilities"),
])
def test_a_child_holds_exactly_its_runtime_roots_capabilities(held, verdict):
    """Issue 31, D10: a launch reading a runtime root holds that root's standing grant's
    capability, and nothing else: one missing, or one more, refuses it before it runs."""
    got = tokens.token_refusal(True, True, PACKAGE, held, PACKAGE, (RUNTIME,))
    assert got == verdict if verdict is None else verdict in got


def test_processes_are_created_suspended_detached_with_an_extended_startup_info():
    flags = process.CREATION_FLAGS
    assert flags & c.CREATE_SUSPENDED and flags & c.DETACHED_PROCESS
    assert flags & c.EXTENDED_STARTUPINFO_PRESENT and flags & c.CREATE_UNICODE_ENVIRONMENT
    assert not flags & 0x01000000  # never CREATE_BREAKAWAY_FROM_JOB
