"""The Windows backend tells the truth (issue 20, item 3), against FakeWin32, whose functions
behave as Microsoft documents them: profile existence is asked without side effects (deleting a
profile that does not exist succeeds, so deletion proves nothing); the token buffer holding the
package SID is alive while it is read; the build floor is 17763; a terminated Job is drained
before anything it used is undone; the desktop has a bounded heap and the window station an
entry for the launch alone; and a child whose Job, handles, mitigations or desktop read back
otherwise than launched is refused."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from test_windows_fakes import (
    CREATE_BREAKAWAY_FROM_JOB,
    PACKAGE,
    USER,
    FakeWin32,
    bind_win32,
    win32_error,
)

from stockade import program
from stockade.errors import SetupError, UnenforceableError
from stockade.launch.request import LimitSpec
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import Ledger
from stockade.windows import acl, backend, desktop, handle, identity, job, process, records, tokens
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace
from stockade.windows.probe import Win32Host

PROFILE = "stockade-ac-" + "ab" * 12


@pytest.fixture
def kinds(monkeypatch):
    """The ledger's kinds as they are; what a test registers is gone after it."""
    monkeypatch.setattr(removers, "REMOVERS", dict(removers.REMOVERS))
    monkeypatch.setattr(removers, "_VALIDATORS", dict(removers._VALIDATORS))


@pytest.fixture
def fake(monkeypatch) -> FakeWin32:
    fake = FakeWin32()
    bind_win32(monkeypatch, fake, identity, tokens, job, desktop, process, handle)
    return fake


# --- profiles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("folder_fails", [False, True], ids=["computed-path", "not-found"])
def test_a_profile_is_seen_to_exist_or_not_without_deleting_anything(fake, folder_fails):
    sid = ctypes.c_void_p()
    assert fake.CreateAppContainerProfile(PROFILE, "", "", None, 0, ctypes.byref(sid)) == 0
    assert identity.profile_exists(PROFILE, fake.is_dir)
    fake.DeleteAppContainerProfile(PROFILE)
    fake.folder_fails = folder_fails  # both answers the documentation leaves open
    assert not identity.profile_exists(PROFILE, fake.is_dir)
    assert not identity.profile_exists("stockade-ac-" + "cd" * 12, fake.is_dir)
    assert [call for call in fake.calls if call[0] == "DeleteAppContainerProfile"] == [
        ("DeleteAppContainerProfile", PROFILE)]  # only the test's own


def test_deleting_a_profile_that_never_existed_succeeds_so_the_probe_asks_existence(
        fake, monkeypatch):
    assert fake.DeleteAppContainerProfile(PROFILE) == 0  # the documented S_OK
    monkeypatch.setattr(identity.os.path, "isdir", fake.is_dir)
    host = Win32Host()
    assert host.profile_exists(PROFILE) is False
    assert host.package_sid(PROFILE) == fake.derived(PROFILE)
    sid = ctypes.c_void_p()
    fake.CreateAppContainerProfile(PROFILE, "", "", None, 0, ctypes.byref(sid))
    asked = len(fake.calls)
    assert host.profile_exists(PROFILE) is True
    assert fake.calls[asked:] == [] and PROFILE in fake.profiles  # nothing changed by asking


def test_a_profile_whose_storage_stays_is_not_counted_deleted(fake):
    sid = ctypes.c_void_p()
    fake.CreateAppContainerProfile(PROFILE, "", "", None, 0, ctypes.byref(sid))
    fake.holding.add(PROFILE)  # a process of the sandbox still holds a file in it
    with pytest.raises(OSError, match="still there"):
        identity.delete_profile(PROFILE, fake.is_dir)
    fake.holding.clear()
    identity.delete_profile(PROFILE, fake.is_dir)  # the next reconcile's retry
    identity.delete_profile(PROFILE, fake.is_dir)  # and again: idempotent
    assert not identity.profile_exists(PROFILE, fake.is_dir)


def test_an_unexplained_folder_path_failure_proves_nothing_while_windows_maps_the_sid(
        fake, monkeypatch):
    sid = ctypes.c_void_p()
    fake.CreateAppContainerProfile(PROFILE, "", "", None, 0, ctypes.byref(sid))
    monkeypatch.setattr(fake, "GetAppContainerFolderPath",
                        lambda sid, ref: 0x80070005 - (1 << 32))  # E_ACCESSDENIED
    with pytest.raises(OSError, match="0x80070005"):
        identity.profile_exists(PROFILE, fake.is_dir, fake.mapped)


def test_a_deleted_profiles_undocumented_answer_is_absent_when_windows_maps_it_no_more(
        fake, monkeypatch, caplog):
    # (issue 31, D9: E_INVALIDARG for a deleted profile raised in settlement, exit 70 after
    # the command had run)
    sid = ctypes.c_void_p()
    fake.CreateAppContainerProfile(PROFILE, "", "", None, 0, ctypes.byref(sid))
    monkeypatch.setattr(fake, "GetAppContainerFolderPath",
                        lambda sid, ref: 0x80070057 - (1 << 32))  # E_INVALIDARG
    fake.DeleteAppContainerProfile(PROFILE)
    with caplog.at_level("INFO", logger=identity.__name__):
        assert identity.profile_exists(PROFILE, fake.is_dir, fake.mapped) is False
        identity.delete_profile(PROFILE, fake.is_dir, fake.mapped)  # settles
    assert "0x80070057" in caplog.text


# --- tokens ------------------------------------------------------------------------------------


def test_the_package_sid_is_read_while_its_buffer_is_alive(fake):
    fake.token_answers(1, PACKAGE)
    seen = tokens.child_token(0x10, 0x20)
    assert seen == tokens.ChildToken(True, True, PACKAGE, ())
    runtime = "S-1-15-3-1024-11-22-33-44-55-66-77-88"
    fake.token_answers(1, PACKAGE, (runtime, "S-1-15-3-1"))  # (TOKEN_GROUPS, SIDs after it)
    assert tokens.child_token(0x10, 0x20).capabilities == (runtime, "S-1-15-3-1")
    fake.token_answers(0, "")
    assert tokens.child_token(0x10, 0x20).package_sid == ""


def test_a_sid_pointer_outside_its_buffer_is_refused():
    raw = (0).to_bytes(8, "little") + sids.to_bytes(PACKAGE)
    assert tokens.sid_in(raw, 0x1000, 0x1008) == PACKAGE
    for pointer in (0x0FF8, 0x1000, 0x1000 + len(raw)):
        with pytest.raises(ValueError):
            tokens.sid_in(raw, 0x1000, pointer)
    assert tokens.sid_in(raw, 0x1000, None) == ""


# --- build floor -------------------------------------------------------------------------------


def test_the_backend_needs_windows_10_1809():
    assert backend.MINIMUM_BUILD == 17763
    assert backend.build_refusal(17763) is None and backend.build_refusal(26100) is None
    for build in (10240, 14393, 17134, 17762):
        assert "17763" in backend.build_refusal(build)


# --- Jobs --------------------------------------------------------------------------------------


def test_the_jobs_settings_are_read_back_not_copied_from_the_plan(fake):
    plan = job.job_plan(LimitSpec(memory=256 << 20, pids=8, cpu=1.0), cpus=4)
    handle_ = job.create_job(plan)
    assert job.observed(handle_) == job.applied(plan) == {
        "kill_on_close": True, "breakaway": False, "die_on_unhandled_exception": True,
        "ui_restrictions": "all", "memory": 256 << 20, "active_processes": 8,
        "cpu_rate": 2500}
    # What the Job holds is what is reported, even when it is not what was planned.
    leaky = job.extended_limits(plan)
    leaky.BasicLimitInformation.LimitFlags |= c.JOB_OBJECT_LIMIT_BREAKAWAY_OK
    fake.jobs[handle_]["set"][c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION] = bytes(leaky)
    assert job.observed(handle_)["breakaway"] is True
    assert job.observed(handle_) != job.applied(plan)


def test_no_sandbox_job_lets_a_process_break_away(fake):
    """Issue 31, item 7: a Job with JOB_OBJECT_LIMIT_BREAKAWAY_OK lets a child created with
    CREATE_BREAKAWAY_FROM_JOB leave it, and with it the Job's limits and UI restrictions. The
    sandbox's Job never sets it (nor SILENT_BREAKAWAY_OK): a plan that asks for either is not
    made, and a child whose Job, as read back, allows breakaway is refused before it runs,
    whatever the plan said (the check was only "as planned")."""
    plan = job.job_plan(LimitSpec(memory=1 << 30), cpus=2)
    sealed = job.create_job(plan)
    assert not fake.breaks_away(sealed, CREATE_BREAKAWAY_FROM_JOB)
    for flag in (c.JOB_OBJECT_LIMIT_BREAKAWAY_OK, c.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK):
        leaky = dataclasses.replace(plan, limit_flags=plan.limit_flags | flag)
        made = len(fake.jobs)
        with pytest.raises(SetupError) as refused:
            job.create_job(leaky)
        assert refused.value.code == "job_breakaway" and len(fake.jobs) == made
        assert "break away" in handle.confinement_refusal(
            PACKAGE, leaky, process.mitigations(False), seen_ok(leaky))
    # (the model lets a child out of a Job that allows it: the refusals above are what keep it)
    fake.jobs[sealed]["set"][c.JOB_OBJECT_EXTENDED_LIMIT_INFORMATION] = bytes(
        job.extended_limits(dataclasses.replace(
            plan, limit_flags=plan.limit_flags | c.JOB_OBJECT_LIMIT_BREAKAWAY_OK)))
    assert fake.breaks_away(sealed, CREATE_BREAKAWAY_FROM_JOB)


def test_a_memory_limit_off_a_page_boundary_reads_back_as_set(fake):
    """Issue 31, D13: a Job keeps its memory limit in whole pages, so one asked for off a page
    boundary read back otherwise than set, and every such launch was refused
    (confinement_unverified). The plan sets whole pages, never more than asked."""
    plan = job.job_plan(LimitSpec(memory=100_000_001), cpus=1)
    assert plan.job_memory % job.PAGE == 0 and 100_000_001 - job.PAGE < plan.job_memory \
        <= 100_000_001
    assert job.observed(job.create_job(plan)) == job.applied(plan)
    with pytest.raises(UnenforceableError):
        job.job_plan(LimitSpec(memory=job.PAGE - 1), cpus=1)


def test_a_terminated_job_is_waited_for_until_it_holds_no_process(fake):
    handle_ = job.create_job(job.job_plan(LimitSpec(), cpus=1))
    fake.jobs[handle_]["active"] = 3
    assert job.active_processes(handle_) == 3  # not terminating: nothing goes away
    fake.TerminateJobObject(handle_, 1)
    assert job.drained(lambda: job.active_processes(handle_), 5.0)
    assert job.active_processes(handle_) == 0


def test_a_job_that_does_not_drain_in_time_is_reported():
    clock = iter(range(100))
    assert not job.drained(lambda: 1, 3.0, clock=lambda: next(clock), sleep=lambda s: None)


def settled_handle(fake: FakeWin32, state: str, order: list) -> handle.WindowsHandle:
    """A WindowsHandle as `_launch` leaves it, its ledger record holding a profile and a DACL
    change whose removers note how many processes the Job still held when they ran."""
    job_handle = fake.CreateJobObjectW(None, None)
    fake.jobs[job_handle]["active"] = 4  # the child and three descendants
    active = fake.jobs[job_handle]

    def note(kind):
        return lambda name, detail: order.append((kind, active["active"]))

    removers.register(records.PROFILE_KIND, records.validate_profile, note("profile"))
    removers.register("winacl", lambda name, detail: None, note("acl"))
    h = handle.WindowsHandle.__new__(handle.WindowsHandle)
    h._lock, h._killed, h._pipes, h._kept_leases = handle.threading.Lock(), False, None, None
    h._job, h._stack = job_handle, contextlib.ExitStack()
    held = h._stack.enter_context(contextlib.ExitStack())
    held.callback(lambda: order.append(("lease", active["active"])))
    record = h._stack.enter_context(Ledger(state).launch("request-drain"))
    record.add(records.PROFILE_KIND, PROFILE)
    record.add("winacl", "C:\\ws", {})
    h._stack.callback(fake.CloseHandle, job_handle)
    h._stack.callback(h._drain, job_handle, record, held)
    return h


def test_settlement_undoes_nothing_before_the_job_has_drained(fake, tmp_path, kinds):
    order: list = []
    h = settled_handle(fake, str(tmp_path / "state"), order)
    assert h._close() is None
    assert order == [("acl", 0), ("profile", 0), ("lease", 0)]  # all after the last process
    assert Ledger(str(tmp_path / "state")).records() == []


def test_a_job_that_does_not_drain_leaves_its_record_for_the_next_reconcile(
        fake, tmp_path, monkeypatch, kinds):
    order: list = []
    monkeypatch.setattr(job, "drained", lambda active, wait=0: False)
    state = str(tmp_path / "state")
    h = settled_handle(fake, state, order)
    failure = h._close()
    assert isinstance(failure, SetupError) and failure.code == "job_not_drained"
    assert order == []  # nothing undone, the leases kept
    assert len(Ledger(state).records()) == 1
    done = Ledger(state).reconcile()  # the lease is free: the next reconcile settles it
    assert (done.reconciled, done.failed) == (1, 0)
    assert [kind for kind, _ in order] == ["acl", "profile"]


def test_two_callers_waiting_at_once_share_one_settlement(monkeypatch):
    """Issue 31, D17: while one wait() settled the launch (which closes the process handle
    first), a second caller waited on the closed handle value (WAIT_FAILED, or another
    object's wait once the value is reused) and could settle again, its Exit without the
    first one's failure. Now it waits its turn (or times out: not over yet) and gets the one
    Exit."""
    process_ = 0x40
    closed: set[int] = set()

    class Api:
        def WaitForSingleObject(self, value, ms):  # noqa: N802
            if value in closed:  # WAIT_FAILED, ERROR_INVALID_HANDLE (api._wait raises it)
                raise win32_error(c.ERROR_INVALID_HANDLE, "WaitForSingleObject")
            return c.WAIT_OBJECT_0

        def GetExitCodeProcess(self, value, ref):  # noqa: N802
            ref._obj.value = 3
            return 1

        def CloseHandle(self, value):  # noqa: N802
            closed.add(value)
            return 1

    api = Api()
    monkeypatch.setattr(handle, "win32", lambda: api)
    settling, release, settled = threading.Event(), threading.Event(), []
    h = handle.WindowsHandle.__new__(handle.WindowsHandle)
    h._lock, h._waiting, h._killed, h._pipes = threading.Lock(), threading.Lock(), False, None
    h._network = None
    h._job, h._exit, h._process, h.stages = None, None, process_, []
    h._stack = contextlib.ExitStack()

    def undo() -> None:  # the rest of settlement, held until the second caller has come
        settling.set()
        release.wait(10)
        settled.append(1)

    h._stack.callback(undo)
    h._stack.callback(api.CloseHandle, process_)  # (closed first, as _launch stacks it)
    ends: dict[str, object] = {}
    first = threading.Thread(target=lambda: ends.update(first=h.wait()))
    first.start()
    assert settling.wait(10)
    assert h.wait(0.05) is None  # still settling: not over yet
    second = threading.Thread(target=lambda: ends.update(second=h.wait()))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert ends["first"] is ends["second"] and ends["first"].exit_code == 3
    assert settled == [1]

# --- desktop and window station ----------------------------------------------------------------


def test_the_desktop_is_created_with_a_bounded_heap(monkeypatch):
    made = []
    api = SimpleNamespace(
        ConvertStringSecurityDescriptorToSecurityDescriptorW=lambda *a: 1,
        CreateDesktopExW=lambda *args: made.append(args) or 0x77, LocalFree=lambda p: None)
    monkeypatch.setattr(desktop, "win32", lambda: api)
    monkeypatch.setattr(desktop, "fresh_last_error", lambda: None)
    monkeypatch.setattr(desktop, "last_error", lambda: 0)
    assert desktop.create_desktop("stockade-x", desktop.desktop_sddl(USER, PACKAGE)) == 0x77
    ((name, device, mode, flags, access, attributes, heap, reserved),) = made
    assert (name, device, mode, flags, heap, reserved) == ("stockade-x", None, None, 0,
                                                           desktop.DESKTOP_HEAP_KB, None)
    assert 0 < desktop.DESKTOP_HEAP_KB <= 4096  # kilobytes, far below an interactive desktop's


def test_the_window_station_gains_one_entry_for_the_launch_and_loses_exactly_it():
    station = (Ace.allow(USER, 0x37F, acl.CONTAINER_INHERIT | acl.INHERIT_ONLY),
               Ace.allow(USER, 0x37F), Ace.allow(sids.SYSTEM, 0xF037F))
    granted = desktop.station_granted(station, PACKAGE)
    assert granted[:3] == station and len(granted) == 4
    assert acl.allowed(granted, PACKAGE) == desktop.STATION_RIGHTS == 0x22
    assert not granted[3].flags  # not inherited by the desktops made in it
    assert desktop.station_granted(granted, PACKAGE) == granted  # idempotent
    assert desktop.station_revoked(granted, PACKAGE.lower()) == station
    with pytest.raises(ValueError):
        desktop.station_granted(station, USER)  # never a user's or group's entry


def test_a_window_station_that_grants_the_user_nothing_refuses_the_launch_typed(monkeypatch):
    """WINREAD 2: a user started by Start-Process -Credential (or runas) runs on its starter's
    window station, whose DACL allows the starter's logon SID and SYSTEM only: opening it to
    add the launch's entry, and creating the desktop on it, are denied. That was a bare
    `windows_setup_failed`; now it is `window_station_denied` (70), before anything is
    recorded for the station, and the refusal says what to do. Granted the entries
    scripts/windows-unelevated.ps1 adds, the same user gets through."""
    fake = FakeWin32()
    fake.token_sids = (USER, "S-1-5-32-545", "S-1-1-0", "S-1-5-5-0-999")  # its own logon SID
    bind_win32(monkeypatch, fake, desktop)
    monkeypatch.setattr(desktop, "fresh_last_error", lambda: None)
    monkeypatch.setattr(desktop, "last_error", lambda: 0)
    sddl = desktop.desktop_sddl(USER, PACKAGE)
    for attempt in (lambda: desktop.check_station("WinSta0"),
                    lambda: desktop.create_desktop("stockade-x", sddl)):
        with pytest.raises(SetupError) as refused:
            attempt()
        assert refused.value.code == "window_station_denied"
        assert refused.value.exit_code == 70 and refused.value.stage == "job_desktop"
        assert "windows-unelevated.ps1" in refused.value.message
    # the entry the script adds for the user (WINSTA_ALL_ACCESS, READ_CONTROL, WRITE_DAC)
    fake.stations["WinSta0"] += (Ace.allow(USER, 0x37F | c.READ_CONTROL | c.WRITE_DAC),)
    desktop.check_station("WinSta0")
    assert desktop.create_desktop("stockade-x", sddl) == 0xA00
    assert fake._open_stations == {}  # (the check closes what it opened)


@pytest.mark.parametrize(("name", "detail"), [
    ("WinSta0", {"sid": USER}), ("WinSta0", {"sid": sids.ALL_APP_PACKAGES}),
    ("WinSta0", {}), ("WinSta0", {"sid": PACKAGE, "more": 1}), ("a\\b", {"sid": PACKAGE}),
    ("", {"sid": PACKAGE}),
])
def test_a_window_station_record_names_a_station_and_a_package_sid_only(name, detail):
    with pytest.raises(ValueError):
        records.validate_station(name, detail)


def test_a_window_station_record_is_valid_for_a_service_station_too():
    for name in ("WinSta0", "Service-0x0-3e7$"):
        records.validate_station(name, {"sid": PACKAGE})


# --- what the suspended child is found to be ---------------------------------------------------


def test_mitigation_bits_come_from_the_reported_policies():
    assert process.mitigation_bits(1, 0b11) == process.mitigations(False)
    assert process.mitigation_bits(1, 0b01) == process.mitigations(True)
    assert process.mitigation_bits(0, 0) == 0


@pytest.mark.parametrize(("held", "refused"), [
    ((True, True, True, False), None), ((True, True, False, False), "standard"),
    ((True, True, True, True), "outside its handle list"),
])
def test_the_child_must_hold_its_three_handles_and_not_the_canary(held, refused):
    verdict = process.handles_refusal(held)
    assert verdict is None if refused is None else refused in verdict


def test_holding_is_judged_by_the_object_behind_the_value(monkeypatch):
    class Child:
        def DuplicateHandle(self, process_, value, target, ref, access, inherit, options):  # noqa
            if value not in {4, 8, 12, 40}:
                error = OSError(None, "invalid handle")
                error.winerror = c.ERROR_INVALID_HANDLE
                raise error
            ref._obj.value = value + 1000
            return 1

        def CompareObjectHandles(self, copy, ours):  # noqa: N802
            return copy.value - 1000 == ours and ours != 40  # 40: a different object of that value

        GetCurrentProcess = staticmethod(lambda: -1)  # noqa: N815
        CloseHandle = staticmethod(lambda h: 1)  # noqa: N815

    monkeypatch.setattr(process, "win32", lambda: Child())
    assert process.holds(0x50, (4, 8, 12, 16, 40)) == (True, True, True, False, False)


def seen_ok(plan: job.JobPlan) -> dict:
    return {"token": tokens.ChildToken(True, True, PACKAGE, ()), "job": job.applied(plan),
            "handles": (True, True, True, False), "mitigations": process.mitigations(False),
            "desktop": {"name": "stockade-x", "appcontainer_rights": desktop.APPCONTAINER_RIGHTS,
                        "every_appcontainer_rights": 0,
                        "station_rights": desktop.STATION_RIGHTS},
            "broker": {"pid": os.getpid() + 1, "creator": os.getpid() + 1,
                       "manifest_consumed": True}}


def test_mitigations_the_host_adds_beyond_those_asked_for_are_accepted():
    """Issue 31, D14: Exploit Protection may switch on more mitigations for the image than the
    launch asked for (here: Low-labelled images blocked although exec_from_write allows them);
    the child is confined at least as asked, so it is not refused. One asked for and missing
    still is."""
    plan = job.job_plan(LimitSpec(), cpus=2)
    seen = seen_ok(plan) | {"mitigations": process.mitigations(False)}
    assert handle.confinement_refusal(PACKAGE, plan, process.mitigations(True), seen) is None
    seen["mitigations"] &= ~c.MITIGATION_IMAGE_LOAD_NO_REMOTE_ALWAYS_ON
    assert "mitigation" in handle.confinement_refusal(PACKAGE, plan, process.mitigations(True),
                                                      seen)


@pytest.mark.parametrize(("change", "words"), [
    (lambda s: s.update(token=tokens.ChildToken(False, True, PACKAGE, ())), "Job"),
    (lambda s: s.update(handles=(True, True, True, True)), "handle list"),
    (lambda s: s["job"].update(breakaway=True), "break away"),
    (lambda s: s["job"].update(memory=0), "settings it was given"),
    (lambda s: s.update(mitigations=process.mitigations(True)), "mitigation"),
    (lambda s: s["desktop"].update(every_appcontainer_rights=1), "desktop"),
    (lambda s: s["desktop"].update(station_rights=0), "window station"),
    # issue 36, item 3: made by the launch's broker, not by this process or another
    (lambda s: s["broker"].update(creator=os.getpid()), "broker"),
    (lambda s: s["broker"].update(creator=os.getpid() + 5), "broker"),
    (lambda s: s["broker"].update(pid=os.getpid(), creator=os.getpid()), "broker"),
])
def test_a_child_found_otherwise_than_launched_is_refused(change, words):
    plan = job.job_plan(LimitSpec(memory=1 << 30), cpus=2)
    seen = seen_ok(plan)
    assert handle.confinement_refusal(PACKAGE, plan, process.mitigations(False), seen) is None
    change(seen)
    assert words in handle.confinement_refusal(PACKAGE, plan, process.mitigations(False), seen)


# --- the child's standard handles --------------------------------------------------------------


class Duplicates:
    """DuplicateHandle and CloseHandle over a count of open handles; msvcrt.get_osfhandle,
    which raises OSError for a descriptor that is not open (as documented)."""

    def __init__(self) -> None:
        self.open: set[int] = set()

    def GetCurrentProcess(self):  # noqa: N802
        return -1

    def DuplicateHandle(self, source, value, target, ref, access, inherit, options):  # noqa: N802
        ref._obj.value = 0x1000 + 4 * len(self.open)
        self.open.add(ref._obj.value)
        return 1

    def CloseHandle(self, value):  # noqa: N802
        self.open.remove(value)
        return 1

    @staticmethod
    def get_osfhandle(fd: int) -> int:
        os.fstat(fd)
        return fd


def test_a_failing_stdio_spec_leaves_nothing_of_the_earlier_ones(monkeypatch, tmp_path):
    """Issue 31, D16: when stderr's spec fails (a closed file), the pipes already made for
    stdin (PIPE) and stdout (None: relayed to the owner's stdout) were left open and the relay
    started, for a child that never comes."""
    from stockade.launch.backend import Stdio

    stdio, made, fake = stdio_fakes(monkeypatch)
    closed = open(tmp_path / "err", "wb")  # noqa: SIM115
    closed.close()
    with pytest.raises(ValueError):
        stdio.ChildStdio(Stdio(stdin=subprocess.PIPE, stdout=None, stderr=closed))
    assert len(made) == 4 and fake.open == set()
    for fd in made:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert not [t for t in threading.enumerate() if t.name.startswith("stockade-relay")]


def stdio_fakes(monkeypatch):
    """The stdio module over Duplicates, every pipe descriptor it makes (os.pipe's pairs, in
    order) and the Duplicates."""
    from stockade.windows import stdio

    fake = Duplicates()
    monkeypatch.setattr(stdio, "win32", lambda: fake)
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    made: list[int] = []
    real_pipe = os.pipe

    def pipe() -> tuple[int, int]:
        made.extend(pair := real_pipe())
        return pair

    monkeypatch.setattr(stdio.os, "pipe", pipe)
    return stdio, made, fake


def test_a_launch_failing_before_the_child_has_its_handles_leaves_nothing_open(monkeypatch):
    """Issue 31, D16: a launch that fails after the child's pipes are made but before
    CreateProcessW (the canary handle, the mitigation plan) calls only `close()`, which left
    the child's ends of the pipes and their inheritable duplicates open."""
    from stockade.launch.backend import Stdio

    stdio, made, fake = stdio_fakes(monkeypatch)
    pipes = stdio.ChildStdio(Stdio(stdin=subprocess.PIPE, stdout=None, stderr=subprocess.DEVNULL))
    assert len(made) == 4 and len(fake.open) == 3
    pipes.close()
    assert fake.open == set()
    for fd in made:
        with pytest.raises(OSError):
            os.fstat(fd)


class Console:
    """The owner's console as CPython on Windows meets it. io.open of a console descriptor,
    binary or not, gives _WindowsConsoleIO, which takes the bytes written as UTF-8 (a byte that
    is not becomes U+FFFD) and writes them as text (WriteConsoleW), and reads text
    (ReadConsoleW) and returns it as UTF-8; the descriptor itself (os.read, os.write: ReadFile,
    WriteFile) passes bytes, which the console takes and gives in its code page (here 850, as
    a Western European console has it). The console is a pipe here: what it shows is its
    bytes in that code page."""

    CODEPAGE = "cp850"

    def __init__(self, fd: int, real_open) -> None:
        self.fd, self.real_open = fd, real_open

    def open(self, file, mode="r", buffering=-1, *args, closefd=True, **kwargs):
        if file != self.fd:
            return self.real_open(file, mode, buffering, *args, closefd=closefd, **kwargs)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def write(self, data: bytes) -> int:
        text = bytes(data).decode("utf-8", "replace")
        os.write(self.fd, text.encode(self.CODEPAGE, "replace"))
        return len(data)

    def read(self, size: int = -1) -> bytes:
        return os.read(self.fd, 65536 if size < 0 else size).decode(self.CODEPAGE).encode()


@pytest.mark.parametrize("index", [0, 1], ids=["stdin", "stdout"])
def test_a_relay_passes_the_bytes_as_they_are_to_and_from_a_console(monkeypatch, index):
    """WINREAD 9: the relays opened the owner's descriptor as a file object, which on a
    console is one that takes bytes as UTF-8: a child's output in its code page ("café" in
    850) reached the console as "caf?", and typed input reached the child as UTF-8."""
    import builtins

    from stockade.launch.backend import Stdio
    from stockade.windows import stdio

    typed = "café ü\r\n".encode(Console.CODEPAGE)
    console_read, console_write = os.pipe()
    saved = os.dup(index)
    os.dup2(console_read if index == 0 else console_write, index)
    monkeypatch.setattr(stdio, "open", Console(index, builtins.open).open, raising=False)
    try:
        spec = [subprocess.DEVNULL] * 3
        spec[index] = None
        stdio, made, _ = stdio_fakes(monkeypatch)
        pipes = stdio.ChildStdio(Stdio(*spec))
        child = os.dup(made[index])  # the child's own end, as CreateProcessW gives it
        pipes.close_child_ends()
        pipes.start_relays()
        if index == 0:
            os.write(console_write, typed)
            os.close(console_write)
            got = os.read(child, 64)
        else:
            os.write(child, typed)
            os.close(child)
            pipes.join_relays()
            os.close(console_write)
            got = os.read(console_read, 64)
    finally:
        os.dup2(saved, index)
        os.close(saved)
    assert got == typed and got.decode(Console.CODEPAGE) == "café ü\r\n"


# --- exit codes ----------------------------------------------------------------------------------


def windows_exit(value: int) -> int:
    """What a Windows process exits with after sys.exit(value) in CPython before 3.12.8 and
    3.13.1: _Py_HandleSystemExit takes (int)PyLong_AsLong(value), a C long is 32 bits on
    Windows (LLP64), and an overflow leaves -1; ExitProcess takes the UINT."""
    return value & 0xFFFFFFFF if -(1 << 31) <= value < 1 << 31 else 0xFFFFFFFF


@pytest.mark.parametrize("code", [0, 7, 255, 0x7FFFFFFF, 0x80000000, 0xC0000005, 0xC0000142,
                                  0xFFFFFFFF])
def test_the_commands_exit_code_is_the_programs_whole_32_bits(monkeypatch, code):
    """Issue 31, D15: a command that crashed exits with an NTSTATUS (0xC0000005), which
    `stockade run` passed to sys.exit as is: Windows saw 0xFFFFFFFF."""
    import stockade.cli

    monkeypatch.setattr(stockade.cli, "console_main", lambda: code)
    monkeypatch.setattr(program.sys, "argv", ["stockade"])
    assert windows_exit(program.main()) == code
