"""The Windows readiness probe and report: on every platform, a fake WindowsBackend whose
handle's `enforced` is what the real handle would record (handle._enforced over a real Job plan
and token observation), so the probe's judgement of each fact, its stable reasons and stages, its
lifetime checks and the report's rows are tested here; on Windows, a real probe."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_windows_fakes import PACKAGE, USER, FakeWin32, bind_win32

import stockade
from stockade.errors import UnenforceableError
from stockade.launch import probe as probe_module
from stockade.launch import report
from stockade.launch.backend import Backend, Exit, Handle, Stdio
from stockade.launch.request import LaunchRequest
from stockade.lifecycle import facts
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.windows import constants as c
from stockade.windows import (
    desktop,
    fenceclient,
    handle,
    identity,
    job,
    process,
    rules,
    structs,
    tokens,
)
from stockade.windows import probe as windows_probe
from stockade.windows import report as windows_report
from stockade.windows import sid as sids
from stockade.windows.acl import Ace, Dacl
from stockade.windows.admission import Entry
from stockade.windows.backend import WindowsBackend
from stockade.windows.structs import PVOID

STATUS_DLL_INIT_FAILED = 0xC0000142  # a process that could not attach to its desktop


DESKTOP = "stockade-" + "5" * 24


BROKER_PID = os.getpid() + 1  # (the launch's broker: another process)


def seen_for(token: tokens.ChildToken, plan: job.JobPlan) -> dict:
    """What the real handle reads back from a suspended child confined as launched."""
    return {"token": token, "job": job.applied(plan), "handles": (True, True, True, False),
            "mitigations": process.mitigations(False),
            "desktop": {"name": DESKTOP, "appcontainer_rights": desktop.APPCONTAINER_RIGHTS,
                        "every_appcontainer_rights": 0, "station_rights": desktop.STATION_RIGHTS},
            "broker": {"pid": BROKER_PID, "creator": BROKER_PID, "manifest_consumed": True}}


def enforced_for(request: LaunchRequest, token: tokens.ChildToken | None = None,
                 plan: job.JobPlan | None = None) -> dict:
    """What the real handle records for `request`, read back as `token` says."""
    token = token or tokens.ChildToken(True, True, PACKAGE, ())
    plan = plan or job.job_plan(request.limits, cpus=4)
    return handle._enforced(request, plan,
                            {"grants": 1, "overrides": 3, "roots_open_to_every_appcontainer": 1,
                             "runtime_roots": 0},
                            seen_for(token, plan), PACKAGE)


def child_report(request: LaunchRequest, *, package: str = PACKAGE, appcontainer: int = 1,
                 capabilities: int = 0, plan: job.JobPlan | None = None,
                 policies: tuple[int, int] = (1, 0b11), in_job: bool = True) -> dict:
    """What the probe child prints: raw answers as probe_child.py sends them."""
    plan = plan or job.job_plan(request.limits, cpus=4)
    address = 0x7FF000010000
    sid = (address + 8).to_bytes(8, "little") + sids.to_bytes(package)

    def raw(data: bytes, at: int = 0) -> dict:
        return {"hex": data.hex(), "address": at or address}

    return {
        "token": {"is_appcontainer": raw(appcontainer.to_bytes(4, "little")),
                  "capabilities": raw(capabilities.to_bytes(4, "little")),
                  "package": raw(sid, address)},
        "job": {"in_job": in_job, "extended": raw(bytes(job.extended_limits(plan))),
                "ui": raw(bytes(job.ui_restrictions(plan))),
                "cpu_rate": raw(bytes(job.cpu_rate(plan)
                                      or structs.JOBOBJECT_CPU_RATE_CONTROL_INFORMATION()))},
        "mitigations": {"extension_points": raw(policies[0].to_bytes(4, "little")),
                        "image_load": raw(policies[1].to_bytes(4, "little"))},
        # (in an interactive session an AppContainer most likely opens Default: issue 31, D3)
        "desktop": {"name": DESKTOP, "default_desktop": "ok"},
        # the launch's own TEMP and TMP, which the backend adds (issue 31, L12)
        "environment": ["PATH", "SYSTEMROOT", "TEMP", "TMP"], "temp": "ok",
        "files": {"write_root": "ok", "protected_name": "denied", "denied_path": "denied",
                  "outside_path": "denied"},
        "tcp_loopback": "denied"}


class FakeHandle(Handle):
    def __init__(self, enforced: dict, exit_code: int, stdout: bytes) -> None:
        self.enforced = enforced
        self.stages = [("spawn", 0.0)]
        self.violations: list = []
        self.network_log: list = []
        self._exit_code = exit_code
        read, write = os.pipe()
        os.write(write, stdout)
        os.close(write)
        self.stdout = os.fdopen(read, "rb")

    def wait(self, timeout: float | None = None) -> Exit:
        return Exit(self._exit_code, None)

    def kill(self) -> None:
        pass


class FakeWindowsBackend(WindowsBackend):
    """The Windows backend's probe and report halves; `enforce(request)` says what its handle
    records, `report(request)` what its child prints, `during(request)` does what the launch
    does to the host before it settles."""

    def __init__(self, enforce: Callable[[LaunchRequest], dict] = enforced_for,
                 exit_code: int = 0, during: Callable[[LaunchRequest], None] = lambda r: None,
                 refuse: UnenforceableError | None = None,
                 report: Callable[[LaunchRequest], dict] = child_report) -> None:
        self.enforce, self.exit_code, self.during, self.refuse = enforce, exit_code, during, refuse
        self.report_of = report
        self.checked: list[LaunchRequest] = []
        self.spawned: list[LaunchRequest] = []

    def probe(self) -> None:
        pass

    def check(self, request: LaunchRequest) -> None:
        """The real backend's check, but for the probe's request: its paths are this host's."""
        self.checked.append(request)
        if self.refuse:
            raise self.refuse
        if request.argv[4:5] != (probe_source(),):
            super().check(request)

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> FakeHandle:
        self.spawned.append(request)
        self.during(request)
        return FakeHandle(self.enforce(request), self.exit_code,
                          json.dumps(self.report_of(request)).encode())

    def report(self) -> list:
        return []


def probe_source() -> str:
    with open(windows_probe.probe_child.__file__) as f:
        return f.read()


class FakeHost:
    """DACLs by path (the same one unless changed), the window station's entries, and the
    profiles of a FakeWin32 (deleting one that does not exist succeeds, as documented), asked
    through the real Win32Host."""

    def __init__(self, monkeypatch) -> None:
        self.dacls: dict[str, Dacl] = {}
        self.station: tuple[Ace, ...] = (Ace.allow(USER, 0x37F),)
        self.win32 = FakeWin32()
        bind_win32(monkeypatch, self.win32, identity)
        # (identity's own default is os.path.isdir, which everything else uses too: the fake
        # answers for its profiles only where identity is asked)
        monkeypatch.setattr(identity, "profile_exists",
                            functools.partial(identity.profile_exists, is_dir=self.win32.is_dir))
        self.real = windows_probe.Win32Host()

    def elevated(self) -> bool:
        return False

    def dacl(self, path: str) -> Dacl:
        assert os.path.isabs(path), path
        return self.dacls.get(path, Dacl((Ace.allow(USER, 0x1F01FF),), False))

    def station_aces(self) -> tuple[Ace, ...]:
        return self.station

    def package_sid(self, name: str) -> str:
        self.win32.derived = lambda name: PACKAGE  # the fake backend's child is of PACKAGE
        return self.real.package_sid(name)

    def profile_exists(self, name: str) -> bool:
        return self.real.profile_exists(name)

    def interpreter(self) -> str:
        return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)

    booted, session_id, in_job, build = 1_700_000_000.0, 1, job.OwnerJob.NONE, "26100.4061"

    def uptime(self) -> float:
        return time.time() - self.booted

    def user_sid(self) -> str:
        return USER

    def session(self) -> int:
        return self.session_id

    def owner_job(self) -> job.OwnerJob:
        return self.in_job

    def os_build(self) -> str:
        return self.build


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "state"))


@pytest.fixture
def host(monkeypatch) -> FakeHost:
    return FakeHost(monkeypatch)


def probed(backend: Backend, ledger: Ledger, host: FakeHost) -> stockade.Attestation:
    return stockade.probe(backend, ledger, platform_half=windows_probe.WindowsProbe(host))


# --- the probe's judgement ---------------------------------------------------------------------


def test_a_launch_the_backend_verified_is_ready(ledger, host):
    backend = FakeWindowsBackend()
    a = probed(backend, ledger, host)
    assert a.ready, a
    assert (a.reason, a.stage, a.message) == (None, None, None)
    assert a.backend == "windows" and a.run_as == "unelevated" and a.version == 1
    assert set(a.versions) == {"stockade", "windows", "python"}
    assert set(a.timings) == {"backend", "ledger", "launch", "checks"}
    expected = {fact for checks in windows_probe.EXPECTATIONS.values() for fact in checks}
    assert expected <= set(a.facts)
    assert set(a.facts) - expected == {"exit_code", "roots_open_to_every_appcontainer",
                                       "runtime_roots",
                                       "default_desktop"}  # (for information)
    assert a.facts["exit_code"] == 0 and a.facts["capabilities"] == 0
    assert set(a.facts) <= set(windows_probe.LEGEND)  # (`stockade probe --explain`)
    assert a.facts["job_memory"] == facts.PROBE_MEMORY
    # The request it checked and launched: the probe child, network none, the minimal roots.
    (request,) = backend.spawned
    assert backend.checked == [request]
    assert request.argv[1:4] == ("-I", "-S", "-c") and request.argv[4] == probe_source()
    params = json.loads(request.argv[5])
    assert params["sizes"] == {"extended": 144, "ui": 4, "cpu_rate": 8}
    assert params["denied"] == os.path.join(request.cwd, "secret")
    assert not any(params["outside"].startswith(g.path) for g in request.read + request.write)
    assert request.network.mode == "none" and request.protected == (".git",)
    assert [g.path for g in request.write] == [request.cwd]
    assert [g.path for g in request.deny] == [os.path.join(request.cwd, "secret")]
    assert [name for name, _ in request.env] == ["PATH", "SystemRoot"]
    assert request.limits.file_size is None and request.limits.memory == facts.PROBE_MEMORY
    # Asking whether the profile is gone deleted nothing.
    assert not [call for call in host.win32.calls if call[0] == "DeleteAppContainerProfile"]
    # Its directory is gone, and nothing is left in the ledger.
    assert os.listdir(os.path.join(ledger.root, "work")) == [] and ledger.records() == []


def weakened(change: Callable[[dict], None]) -> Callable[[LaunchRequest], dict]:
    def enforce(request: LaunchRequest) -> dict:
        enforced = enforced_for(request)
        change(enforced)
        return enforced
    return enforce


def reported(change: Callable[[dict], None], **given) -> Callable[[LaunchRequest], dict]:
    def report(request: LaunchRequest) -> dict:
        seen = child_report(request, **given)
        change(seen)
        return seen
    return report


def _set(*keys: str, value: object) -> Callable[[dict], None]:
    def change(enforced: dict) -> None:
        for key in keys[:-1]:
            enforced = enforced[key]
        enforced[keys[-1]] = value
    return change


_as_is = reported(lambda r: None)
_leaky_plan = job.JobPlan(job.ALWAYS | 0x800, facts.PROBE_MEMORY, facts.PROBE_PIDS)


@pytest.mark.parametrize("enforce, report, reason, stage, fact", [
    (lambda r: enforced_for(r, tokens.ChildToken(False, True, PACKAGE, ())), _as_is,
     "job_not_enforced", "job", "in_job"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, False, "", ())), _as_is,
     "identity_not_enforced", "identity", "appcontainer_token"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, True, PACKAGE[:-1] + "0", ())), _as_is,
     "identity_not_enforced", "identity", "launch_package_sid"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, True, PACKAGE, ("S-1-15-3-1",))), _as_is,
     "identity_not_enforced", "identity", "capabilities"),
    (weakened(lambda e: e.pop("verified")), _as_is, "identity_not_enforced", "identity",
     "appcontainer_token"),
    # issue 36, item 3: the child is the broker's, and the broker consumed its manifest
    (weakened(lambda e: e["broker"].update(pid=os.getpid(), creator=os.getpid())), _as_is,
     "broker_not_enforced", "broker", "launch_brokered"),
    (weakened(_set("broker", "creator", value=BROKER_PID + 4)), _as_is, "broker_not_enforced",
     "broker", "launch_brokered"),
    (weakened(lambda e: e.pop("broker")), _as_is, "broker_not_enforced", "broker",
     "launch_brokered"),
    (weakened(_set("broker", "manifest_consumed", value=False)), _as_is,
     "broker_not_enforced", "broker", "manifest_consumed"),
    # What the child reports from inside is judged too, not only what was read back outside.
    (enforced_for, reported(lambda r: None, appcontainer=0), "identity_not_enforced",
     "identity", "child_appcontainer_token"),
    (enforced_for, reported(lambda r: None, package=PACKAGE[:-1] + "0"),
     "identity_not_enforced", "identity", "child_launch_package_sid"),
    (enforced_for, reported(lambda r: None, capabilities=1), "identity_not_enforced",
     "identity", "child_capabilities"),
    (weakened(_set("job", "breakaway", value=True)), _as_is, "job_not_enforced", "job",
     "job_breakaway"),
    (weakened(_set("job", "kill_on_close", value=False)), _as_is, "job_not_enforced", "job",
     "job_kill_on_close"),
    (weakened(_set("job", "ui_restrictions", value="0x1")), _as_is, "job_not_enforced", "job",
     "job_ui_restrictions"),
    (enforced_for, reported(lambda r: None, in_job=False), "job_not_enforced", "job",
     "child_in_job"),
    (enforced_for, reported(lambda r: None, plan=_leaky_plan), "job_not_enforced", "job",
     "child_sees_the_job"),
    (enforced_for, reported(_set("desktop", "name", value="Default")), "desktop_not_enforced",
     "desktop", "private_desktop"),
    (weakened(_set("desktop", "every_appcontainer_rights", value=1)), _as_is,
     "desktop_not_enforced", "desktop", "desktop_rights"),
    (weakened(_set("desktop", "station_rights", value=0x37F)), _as_is,
     "desktop_not_enforced", "desktop", "station_rights"),
    (weakened(_set("handles", "outside_list", value=1)), _as_is, "handles_not_enforced",
     "handles", "inherited_outside_list"),
    (weakened(_set("handles", "standard", value=2)), _as_is, "handles_not_enforced",
     "handles", "inherited_standard"),
    (weakened(_set("filesystem", "overrides", value=0)), _as_is, "filesystem_not_enforced",
     "filesystem", "acl_overrides"),
    (enforced_for, reported(_set("files", "outside_path", value="ok")),
     "filesystem_not_enforced", "filesystem", "outside_path"),
    (enforced_for, reported(_set("files", "protected_name", value="ok")),
     "filesystem_not_enforced", "filesystem", "protected_name"),
    (enforced_for, reported(lambda r: None, policies=(1, 0b01)), "filesystem_not_enforced",
     "filesystem", "no_low_label_images"),
    (weakened(_set("mitigations", value=0)), _as_is, "filesystem_not_enforced", "filesystem",
     "child_mitigations_as_read_back"),
    (enforced_for, reported(_set("tcp_loopback", value="ok")), "network_not_enforced",
     "network", "tcp_loopback"),
    (enforced_for, reported(_set("environment", value=["PATH", "SECRET", "SYSTEMROOT"])),
     "environment_not_enforced", "environment", "environment"),
    (enforced_for, reported(_set("environment", value=["PATH", "TEMP", "USERPROFILE"])),
     "environment_not_enforced", "environment", "environment"),
    (enforced_for, reported(_set("environment", value=["PATH", "SYSTEMROOT"])),
     "environment_not_enforced", "environment", "environment"),  # no TEMP, TMP (L12)
    (enforced_for, reported(_set("temp", value="denied")), "environment_not_enforced",
     "environment", "temp_writable"),
    (enforced_for, reported(_set("temp", value="unset")), "environment_not_enforced",
     "environment", "temp_writable"),
    (weakened(_set("job", "memory", value=0)), _as_is, "job_not_enforced", "job",
     "child_sees_the_job"),
    (weakened(_set("limits", value={})), _as_is, "limits_not_enforced", "limits", "timeout"),
])
def test_a_fact_that_does_not_hold_fails_readiness_at_its_stage(ledger, host, enforce, report,
                                                                reason, stage, fact):
    a = probed(FakeWindowsBackend(enforce, report=report), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, reason, stage)
    assert a.message.startswith(f"{fact}: observed ")


def test_a_child_report_that_is_not_one_fails_the_launch_stage(ledger, host):
    a = probed(FakeWindowsBackend(report=reported(lambda r: r.pop("token"))), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "probe_command_failed", "launch")


def test_a_job_that_allows_breakaway_is_seen_in_the_jobs_own_facts():
    plan = job.job_plan(LaunchRequest(argv=("x",), cwd="C:\\", env=()).limits, cpus=4)
    assert job.applied(plan) == {
        "kill_on_close": True, "breakaway": False, "die_on_unhandled_exception": True,
        "ui_restrictions": "all", "memory": 0, "active_processes": 0, "cpu_rate": None}
    leaky = replace(plan, limit_flags=plan.limit_flags | 0x800)  # JOB_OBJECT_LIMIT_BREAKAWAY_OK
    assert job.applied(leaky)["breakaway"] is True


def test_token_facts_name_no_sid():
    observed = tokens.ChildToken(True, True, PACKAGE.lower(), ())
    assert observed.refusal(PACKAGE) is None
    assert observed.facts(PACKAGE) == {"in_job": True, "appcontainer_token": True,
                                       "launch_package_sid": True, "capabilities": 0}
    other = tokens.ChildToken(True, True, PACKAGE[:-1] + "0", ())
    assert "not the launch's" in other.refusal(PACKAGE)
    assert other.facts(PACKAGE)["launch_package_sid"] is False


# --- lifetime ----------------------------------------------------------------------------------


def test_a_profile_left_behind_fails_the_lifetime_stage(ledger, host):
    def leave_profile(request: LaunchRequest) -> None:
        name = identity.profile_name(request.request_id, set())
        host.win32.CreateAppContainerProfile(name, "", "", None, 0, ctypes.byref(PVOID()))

    a = probed(FakeWindowsBackend(during=leave_profile), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "lifetime_not_enforced", "lifetime")
    assert a.message.startswith("profile_deleted: observed False")


@pytest.mark.parametrize("name", ["ws", ".git", "secret"])
def test_an_access_control_change_not_reverted_fails_the_lifetime_stage(ledger, host, name):
    def grant_and_forget(request: LaunchRequest) -> None:
        path = request.cwd if name == "ws" else os.path.join(request.cwd, name)
        before = host.dacl(path)
        host.dacls[path] = Dacl(before.aces + (Ace.allow(PACKAGE, 0x1200A9),), True)

    a = probed(FakeWindowsBackend(during=grant_and_forget), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "lifetime_not_enforced", "lifetime")
    assert a.message.startswith("acl_restored: observed False")


def test_a_window_station_entry_left_behind_fails_the_lifetime_stage(ledger, host):
    def grant_and_forget(request: LaunchRequest) -> None:
        host.station = desktop.station_granted(host.station, PACKAGE)

    a = probed(FakeWindowsBackend(during=grant_and_forget), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "lifetime_not_enforced", "lifetime")
    assert a.message.startswith("station_restored: observed False")


def test_a_ledger_record_left_behind_fails_the_lifetime_stage(ledger, host):
    def leave_record(request: LaunchRequest) -> None:
        path = LaunchRecord(ledger, request.request_id).path
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        Path(path).write_text("{}\n")

    a = probed(FakeWindowsBackend(during=leave_record), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "lifetime_not_enforced", "lifetime")
    assert a.message.startswith("ledger_settled: observed False")


# --- launch failures ---------------------------------------------------------------------------


def test_a_command_that_does_not_exit_0_fails_the_launch_stage(ledger, host):
    a = probed(FakeWindowsBackend(exit_code=STATUS_DLL_INIT_FAILED), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "probe_command_failed", "launch")
    assert a.facts["exit_code"] == STATUS_DLL_INIT_FAILED
    assert "private desktop" in a.message
    assert os.listdir(os.path.join(ledger.root, "work")) == []


def test_a_refusal_of_the_probes_request_is_typed_and_names_no_path(ledger, host):
    refusal = UnenforceableError("filesystem.path", "C:\\Users\\X~1\\state: a short name")
    a = probed(FakeWindowsBackend(refuse=refusal), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, "unenforceable:filesystem.path", "launch")
    assert "C:\\" not in a.message and "X~1" not in a.message


def test_off_windows_the_real_backend_fails_at_the_backend_stage(ledger):
    a = stockade.probe(WindowsBackend(), ledger)
    assert (a.ready, a.reason, a.stage) == (False, "backend_unavailable", "backend")
    assert a.run_as == "unknown" and a.facts == {}
    built = report.build(a, WindowsBackend())
    assert built.heading() == "windows: NOT READY (backend_unavailable at stage backend), unknown"
    assert all(row.status != "enforced" for row in built.rows)


def test_the_attestation_names_no_path_sid_or_profile(ledger, host, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2-value")
    backend = FakeWindowsBackend()
    a = probed(backend, ledger, host)
    assert a.ready
    text = json.dumps(a.to_json())
    (request,) = backend.spawned
    for leak in ("hunter2", ledger.root, request.cwd, PACKAGE, USER, "S-1-", "stockade-ac-",
                 "stockade-probe-", "\\\\", "System32"):
        assert leak not in text


# --- the seam ----------------------------------------------------------------------------------


@pytest.mark.linux  # (and the Linux backend's: it imports only on Linux)
def test_the_platform_half_is_the_backends_own():
    from stockade.linux.backend import LinuxBackend
    from stockade.linux.probe import LinuxProbe

    assert isinstance(WindowsBackend().readiness_probe(), windows_probe.WindowsProbe)
    assert isinstance(FakeWindowsBackend().readiness_probe(), windows_probe.WindowsProbe)
    assert isinstance(LinuxBackend().readiness_probe(), LinuxProbe)


def scripted_passes(monkeypatch) -> list[str]:
    """Make `probe` pass at once, scripted; the list it returns names the backend of each
    probe that ran."""
    calls: list[str] = []

    def scripted(backend, ledger=None):
        calls.append(backend.name)
        return probe_module.Attestation(
            ready=True, backend=backend.name, run_as="unelevated", versions={}, facts={},
            enforced={}, timings={}, duration_ms=1.0)

    monkeypatch.setattr(probe_module, "probe", scripted)
    return calls


def test_a_windows_pass_is_cached_per_process_and_not_stored_off_windows(monkeypatch, tmp_path):
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(probe_module, "_cache", {})
    calls = scripted_passes(monkeypatch)
    for _ in range(2):
        assert probe_module.require_ready(FakeWindowsBackend()).ready
    assert calls == ["windows"]
    monkeypatch.setattr(probe_module, "_cache", {})  # as if a new process
    assert probe_module.require_ready(FakeWindowsBackend()).ready
    assert calls == ["windows", "windows"]
    assert not (tmp_path / "state" / "attestation-windows.json").exists()


def test_a_windows_pass_is_stored_for_later_processes_until_what_it_attests_changes(
        monkeypatch, tmp_path, host):
    """Issue 31, D10: every process ran the whole probe (a sandbox launched, walked, granted
    and reverted) before its first launch. A pass is now kept in the state directory (which
    every launch masks) for this boot, user, elevation, session, Job, Windows build,
    interpreter file and versions; a change to any of them probes again."""
    state = tmp_path / "state"
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state))
    monkeypatch.setattr(probe_module, "_cache", {})
    monkeypatch.setattr(FakeWindowsBackend, "readiness_probe",
                        lambda self: windows_probe.WindowsProbe(host))
    python = tmp_path / "python.exe"
    python.write_bytes(b"MZ")
    host.interpreter = lambda: str(python)
    calls = scripted_passes(monkeypatch)

    def new_process() -> int:
        monkeypatch.setattr(probe_module, "_cache", {})
        assert probe_module.require_ready(FakeWindowsBackend()).ready
        return len(calls)

    assert new_process() == 1 and new_process() == 1
    stored = json.loads((state / "attestation-windows.json").read_text())
    assert USER not in json.dumps(stored) and str(python) not in json.dumps(stored)
    changes = [
        lambda: setattr(host, "session_id", 2),
        lambda: setattr(host, "in_job", job.OwnerJob.LETS_GO),
        # (issue 31, item 8: both "in a Job", but only a Job that keeps its children drops the
        # sandbox's UI limits; a bool told them apart from no Job only)
        lambda: setattr(host, "in_job", job.OwnerJob.KEEPS),
        # (a cumulative update, installed across a Fast Startup power cycle that kept the boot)
        lambda: setattr(host, "build", "26100.4062"),
        lambda: monkeypatch.setattr(windows_probe, "PROBE_LIMITS", replace(
            windows_probe.PROBE_LIMITS, timeout=60.0)),
        lambda: monkeypatch.setattr(host, "elevated", lambda: True),
        lambda: python.write_bytes(b"MZ, another build"),
        lambda: monkeypatch.setattr(windows_probe.platform, "version", lambda: "10.0.26100"),
        lambda: monkeypatch.setattr(windows_probe, "__version__", "99.0"),
        lambda: setattr(host, "booted", host.booted + 3600),  # (rebooted)
    ]
    for number, change in enumerate(changes, start=2):
        change()
        assert new_process() == number and new_process() == number
    later = time.time() + probe_module.STORED_TTL
    monkeypatch.setattr(time, "time", lambda: later)  # (the same boot, past the store's TTL)
    assert new_process() == len(changes) + 2


def test_an_attestation_is_stored_where_os_has_no_o_cloexec(monkeypatch, tmp_path):
    """Issue 31 D10's ground: the store opens with the ledger's flags (Windows has no
    O_CLOEXEC; an AttributeError there would not be caught, and no launch would start)."""
    from stockade.lifecycle import lease

    monkeypatch.delattr(os, "O_CLOEXEC")
    monkeypatch.setattr(lease, "OPEN_FLAGS", 0)
    attestation = probe_module.Attestation(
        ready=True, backend="windows", run_as="unelevated", versions={}, facts={},
        enforced={}, timings={}, duration_ms=1.0)
    path = tmp_path / "state" / "attestation-windows.json"
    probe_module._store(str(path), attestation, {"k": 1}, 5.0)
    assert json.loads(path.read_text())["key"] == {"k": 1}

# --- the report --------------------------------------------------------------------------------

CAPABILITIES = [
    "identity", "broker", "filesystem.read", "filesystem.write", "filesystem.deny",
    "filesystem.protected", "filesystem.git", "filesystem.exec_from_write", "filesystem.links",
    "network.none", "network.loopback", "network.link_local", "network.listeners",
    "network.inherited_handles", "network.allowlist", "network.any", "env",
    "limits.memory", "limits.pids", "limits.file_size", "limits.cpu", "limits.timeout",
    "limits.output", "kill_on_close", "desktop", "ui_restrictions", "settlement",
    "windows_sandbox",
]


@pytest.fixture
def ready_report(ledger, host) -> report.Report:
    backend = FakeWindowsBackend()
    return report.build(probed(backend, ledger, host), backend)


def test_the_report_marks_each_capability_from_the_attestation(ready_report):
    rows = {row.name: row for row in ready_report.rows}
    assert list(rows) == CAPABILITIES
    assert all(row.mechanism for row in rows.values())
    assert all(row.reason for row in rows.values() if row.status != "enforced")
    status = {name: row.status for name, row in rows.items()}
    for name in ("identity", "broker", "filesystem.write", "filesystem.deny", "filesystem.links",
                 "network.none", "network.loopback", "network.link_local",
                 "network.inherited_handles", "limits.memory", "limits.pids", "limits.timeout",
                 "limits.output", "kill_on_close", "ui_restrictions", "settlement"):
        assert status[name] == "enforced", name
    # The user's Default desktop opened from inside (an interactive session): partial.
    assert status["desktop"] == "partial" and "Default" in rows["desktop"].reason
    # Enforced, with what it does not cover.
    assert "interpreter" in rows["filesystem.exec_from_write"].reason
    assert status["filesystem.exec_from_write"] == "enforced"
    # Partial: every AppContainer reads ALL APPLICATION PACKAGES; listening sockets unverified.
    assert status["filesystem.read"] == "partial"
    assert "ALL APPLICATION PACKAGES" in rows["filesystem.read"].reason
    assert status["filesystem.protected"] == status["network.listeners"] == "partial"
    assert "listening socket" in rows["network.listeners"].reason
    assert status["env"] == "enforced"  # the child's environment is observed now
    assert status["limits.cpu"] == "partial"
    # Unavailable, with the backend's own reasons.
    for name in ("network.allowlist", "network.any", "limits.file_size"):
        assert status[name] == "unavailable", name
    # (without the egress fence service: how to install it; docs/windows.md)
    for name in ("network.allowlist", "network.any"):
        assert "stockade fence install" in rows[name].reason
    assert "link-local" in rows["network.any"].mechanism
    assert "fence service's WFP filters" in rows["network.link_local"].reason
    assert "per-file size" in rows["limits.file_size"].reason
    # (this host is no Windows: the Windows Sandbox driver's own check, typed)
    assert status["windows_sandbox"] == "unavailable"
    assert rows["windows_sandbox"].reason.startswith("windows_sandbox_unavailable: ")


def test_with_the_fence_service_the_report_names_what_enforces_allowlist_and_any(ledger, host):
    class Fenced(FakeWindowsBackend):
        def check(self, request: LaunchRequest) -> None:  # (the service answers)
            if request.argv[4:5] != (probe_source(),):
                rules.check(request, fence=lambda: None)

    backend = Fenced()
    rows = {row.name: row for row in report.build(probed(backend, ledger, host), backend).rows}
    for name, mechanism in (("network.allowlist", windows_report.ALLOWLIST),
                            ("network.any", windows_report.ANY)):
        assert (rows[name].status, rows[name].mechanism) == ("partial", mechanism)
        assert rows[name].reason == "accepted by the backend, not verified by the readiness probe"
    assert "loopback exemption" in rows["network.allowlist"].mechanism
    assert "WFP filters keyed to" in rows["network.any"].mechanism


def test_an_owner_in_a_job_is_ready_without_ui_limits_and_the_report_says_so(ledger, host):
    # (issue 31, D4) nested: the Job sets no UI limits, read back and seen from inside so
    nested = job.without_ui_limits(job.job_plan(windows_probe.PROBE_LIMITS, cpus=4))

    def enforce(request: LaunchRequest) -> dict:
        return enforced_for(request, plan=nested) | {"owner_in_job": True,
                                                     "ui_limits_dropped": True}

    backend = FakeWindowsBackend(enforce, report=reported(lambda r: None, plan=nested))
    a = probed(backend, ledger, host)
    assert a.ready and a.facts["job_ui_restrictions"] == windows_probe.NESTED_UI, a.message
    row = {row.name: row for row in report.build(a, backend).rows}["ui_restrictions"]
    assert row.status == "partial" and "in a Job" in row.reason
    # the same Job without the owner in one: UI limits missing, not ready
    backend = FakeWindowsBackend(lambda r: enforced_for(r, plan=nested),
                                 report=reported(lambda r: None, plan=nested))
    a = probed(backend, ledger, host)
    assert (a.ready, a.stage, a.reason) == (False, "job", "job_not_enforced")


def test_the_profiles_own_temp_and_localappdata_are_not_a_leak(ledger, host):
    # (issue 31, D12) an AppContainer child may be given its profile's LOCALAPPDATA, TEMP, TMP
    names = ["LOCALAPPDATA", "PATH", "SYSTEMROOT", "TEMP", "TMP"]
    a = probed(FakeWindowsBackend(report=reported(_set("environment", value=names))),
               ledger, host)
    assert a.ready and a.facts["environment"] == names, a.message


def test_a_child_that_opens_the_users_desktop_is_ready_and_the_report_says_so(ledger, host):
    # (issue 31, D3: required before, every interactive Windows 11 session failed readiness)
    for opens, status in (("ok", "partial"), ("denied", "enforced")):
        backend = FakeWindowsBackend(report=reported(_set("desktop", "default_desktop",
                                                          value=opens)))
        a = probed(backend, ledger, host)
        assert a.ready and a.facts["default_desktop"] == opens, a.message
        row = {row.name: row for row in report.build(a, backend).rows}["desktop"]
        assert row.status == status


def test_the_report_renders_the_windows_heading(ready_report):
    assert ready_report.heading() == "windows: ready, not elevated"
    assert ready_report.text().splitlines()[0] == ready_report.heading()
    body = ready_report.to_json()
    assert body["name"] == "windows" and body["run_as"] == "unelevated"
    assert [row["name"] for row in body["capabilities"]] == CAPABILITIES
    assert ready_report.markdown().count("\n| `") == len(CAPABILITIES)


def test_a_failed_probe_leaves_nothing_it_checks_enforced(ledger, host):
    backend = FakeWindowsBackend(weakened(_set("job", "breakaway", value=True)))
    built = report.build(probed(backend, ledger, host), backend)
    rows = {row.name: row for row in built.rows}
    assert built.heading().startswith("windows: NOT READY (job_not_enforced at stage job)")
    for name in ("kill_on_close", "limits.timeout"):
        assert rows[name].status == "unavailable"
        assert rows[name].reason == "not verified: the readiness probe failed (job_not_enforced)"
    assert rows["limits.output"].status == "unavailable"


def sandbox_row(monkeypatch, tmp_path, *, tool: bool = False, program: bool = False):
    """The report's `windows_sandbox` row on a Windows host (as the Windows Sandbox driver's
    check sees one: `sys.platform`) whose PATH and System32 hold the `wsb` tool, or
    WindowsSandbox.exe, or neither."""
    from stockade.vm import wsb

    monkeypatch.setattr(wsb, "sys", SimpleNamespace(platform="win32"))
    monkeypatch.setenv("SystemRoot", str(tmp_path))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    if tool:
        (tmp_path / "bin" / "wsb").write_bytes(b"")
        (tmp_path / "bin" / "wsb").chmod(0o755)
    if program:  # (System32\WindowsSandbox.exe as a name in SystemRoot: os.path is posixpath)
        (tmp_path / "System32\\WindowsSandbox.exe").write_bytes(b"")
    failed = stockade.Attestation(
        ready=False, backend="windows", run_as="unelevated", versions={}, facts={},
        enforced={}, timings={}, duration_ms=0.0, reason="windows_setup_failed",
        stage="launch", message="a Win32 call failed while setting up the probe sandbox")
    rows = {row.name: row for row in report.build(failed, WindowsBackend()).rows}
    return rows["windows_sandbox"]


@pytest.mark.parametrize("found", ["tool", "program"])
def test_the_windows_sandbox_row_is_partial_where_the_feature_is_installed(monkeypatch, tmp_path,
                                                                         found):
    row = sandbox_row(monkeypatch, tmp_path, **{found: True})
    assert (row.status, row.mechanism) == ("partial", wsb_mechanism())
    assert "the readiness probe boots none" in row.reason


def test_the_windows_sandbox_row_is_unavailable_typed_without_the_feature(monkeypatch, tmp_path):
    row = sandbox_row(monkeypatch, tmp_path)
    assert row.status == "unavailable" and row.mechanism == wsb_mechanism()
    assert row.reason == ("windows_sandbox_unavailable: Windows Sandbox is not installed "
                          "(enable the optional feature Containers-DisposableClientVM)")


def wsb_mechanism() -> str:
    from stockade.vm.wsb import WindowsSandboxBackend

    return WindowsSandboxBackend.mechanism


def test_nothing_unverified_is_enforced_on_windows():
    failed = stockade.Attestation(
        ready=False, backend="windows", run_as="unelevated", versions={}, facts={},
        enforced={}, timings={}, duration_ms=0.0, reason="windows_setup_failed",
        stage="launch", message="a Win32 call failed while setting up the probe sandbox")
    built = report.build(failed, WindowsBackend())
    assert all(row.status != "enforced" for row in built.rows)


# --- on Windows: the real probe ----------------------------------------------------------------


@pytest.mark.windows
def test_the_real_probe_on_windows():
    backend = WindowsBackend()
    a = stockade.probe(backend)  # the state directory's ledger, which the backend records in
    assert a.ready, a
    assert a.run_as in ("elevated", "unelevated") and a.facts["exit_code"] == 0
    expected = {fact for checks in windows_probe.EXPECTATIONS.values() for fact in checks}
    assert expected <= set(a.facts)
    assert a.facts["roots_open_to_every_appcontainer"] >= 1  # the system root, left alone
    text = json.dumps(a.to_json())
    for leak in ("S-1-", "stockade-ac-", "stockade-probe-", os.path.expanduser("~"), ":\\\\"):
        assert leak not in text
    rows = {row.name: row.status for row in report.build(a, backend).rows}
    assert rows["identity"] == rows["kill_on_close"] == rows["settlement"] == "enforced"
    assert rows["broker"] == "enforced"  # (a real broker process made the probe's child)
    assert rows["network.any"] == ("partial" if fenceclient.helper_refusal() is None
                                   else "unavailable")
    from stockade.vm import wsb_launcher  # (the `wsb` tool or WindowsSandbox.exe, or neither)

    try:
        wsb_launcher.here()
    except stockade.UnavailableError:
        assert rows["windows_sandbox"] == "unavailable"
    else:
        assert rows["windows_sandbox"] == "partial"


def test_the_probe_reads_and_runs_the_store_pythons_program_not_its_alias(monkeypatch):
    # The Store's Python is an app execution alias in %LOCALAPPDATA%\Microsoft\WindowsApps, a
    # folder of aliases that no root may hold (issue 31, L11).
    aliases = "C:\\Users\\u\\AppData\\Local\\Microsoft\\WindowsApps"
    program = "C:\\Program Files\\WindowsApps\\PythonSoftwareFoundation.Python.3.12\\python.exe"
    monkeypatch.setattr(sys, "_base_executable", aliases + "\\python.exe", raising=False)
    monkeypatch.setattr(windows_probe.os.path, "realpath", lambda path: path)
    kinds = {aliases + "\\python.exe": (c.FILE_ATTRIBUTE_REPARSE_POINT,
                                        c.IO_REPARSE_TAG_APPEXECLINK)}
    monkeypatch.setattr(windows_probe.fsinfo, "entry", lambda path: Entry(
        path, False, *kinds.get(path, (0x20, 0))))
    monkeypatch.setattr(windows_probe.fsinfo, "app_link_target", lambda path: program)
    assert windows_probe.Win32Host().interpreter() == program
    kinds.clear()
    assert windows_probe.Win32Host().interpreter() == aliases + "\\python.exe"
