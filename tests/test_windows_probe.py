"""The Windows readiness probe and report: on every platform, a fake WindowsBackend whose
handle's `enforced` is what the real handle would record (handle._enforced over a real Job plan
and token observation), so the probe's judgement of each fact, its stable reasons and stages, its
lifetime checks and the report's rows are tested here; on Windows, a real probe."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from test_windows_fakes import PACKAGE, USER

import stockade
from stockade.errors import UnenforceableError
from stockade.launch.backend import Backend, Exit, Handle, Stdio
from stockade.launch.request import LaunchRequest
from stockade.lifecycle import facts, report
from stockade.lifecycle import probe as probe_module
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.lifecycle.probe import LinuxProbe, platform_probe
from stockade.windows import handle, identity, job, tokens
from stockade.windows import probe as windows_probe
from stockade.windows.acl import Ace, Dacl
from stockade.windows.backend import WindowsBackend

STATUS_DLL_INIT_FAILED = 0xC0000142  # a process that could not attach to its desktop


def enforced_for(request: LaunchRequest, token: tokens.ChildToken | None = None,
                 plan: job.JobPlan | None = None) -> dict:
    """What the real handle records for `request`, verified as `token` says."""
    token = token or tokens.ChildToken(True, True, PACKAGE, 0)
    return handle._enforced(request, plan or job.job_plan(request.limits, cpus=4),
                            {"grants": 1, "overrides": 3, "roots_open_to_every_appcontainer": 1},
                            token.facts(PACKAGE))


class FakeHandle(Handle):
    def __init__(self, enforced: dict, exit_code: int) -> None:
        self.enforced = enforced
        self.stages = [("spawn", 0.0)]
        self.violations: list = []
        self.network_log: list = []
        self._exit_code = exit_code

    def wait(self, timeout: float | None = None) -> Exit:
        return Exit(self._exit_code, None)

    def kill(self) -> None:
        pass


class FakeWindowsBackend(Backend):
    """Named "windows"; `enforce(request)` says what its handle records, `during(request)`
    does what the launch does to the host before it settles."""

    name = "windows"

    def __init__(self, enforce: Callable[[LaunchRequest], dict] = enforced_for,
                 exit_code: int = 0, during: Callable[[LaunchRequest], None] = lambda r: None,
                 refuse: UnenforceableError | None = None) -> None:
        self.enforce, self.exit_code, self.during, self.refuse = enforce, exit_code, during, refuse
        self.checked: list[LaunchRequest] = []
        self.spawned: list[LaunchRequest] = []

    def probe(self) -> None:
        pass

    def check(self, request: LaunchRequest) -> None:
        """The real backend's check, but for the probe's request: its paths are this host's."""
        self.checked.append(request)
        if self.refuse:
            raise self.refuse
        if request.argv != windows_probe.PROBE_COMMAND:
            WindowsBackend().check(request)

    def spawn(self, request: LaunchRequest, stdio: Stdio) -> FakeHandle:
        self.spawned.append(request)
        self.during(request)
        return FakeHandle(self.enforce(request), self.exit_code)

    def report(self) -> list:
        return []


class FakeHost:
    """DACLs by path (the same one unless changed), a profile that is deleted or left."""

    def __init__(self) -> None:
        self.dacls: dict[str, Dacl] = {}
        self.profile_left_over = False
        self.profiles_asked: list[str] = []

    def elevated(self) -> bool:
        return False

    def dacl(self, path: str) -> Dacl:
        assert os.path.isabs(path), path
        return self.dacls.get(path, Dacl((Ace.allow(USER, 0x1F01FF),), False))

    def profile_left(self, name: str) -> bool:
        self.profiles_asked.append(name)
        return self.profile_left_over


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(str(tmp_path / "state"))


@pytest.fixture
def host() -> FakeHost:
    return FakeHost()


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
    assert set(a.facts) - expected == {"exit_code", "roots_open_to_every_appcontainer"}
    assert a.facts["exit_code"] == 0 and a.facts["capabilities"] == 0
    assert a.facts["job_memory"] == facts.PROBE_MEMORY
    # The request it checked and launched: cmd.exe, network none, the minimal roots.
    (request,) = backend.spawned
    assert backend.checked == [request]
    assert request.argv == ("cmd.exe", "/d", "/c", "exit", "0")
    assert request.network.mode == "none" and request.protected == (".git",)
    assert [g.path for g in request.write] == [request.cwd]
    assert [g.path for g in request.deny] == [os.path.join(request.cwd, "secret")]
    assert request.limits.file_size is None and request.limits.memory == facts.PROBE_MEMORY
    assert host.profiles_asked == [identity.profile_name(request.request_id, set())]
    # Its directory is gone, and nothing is left in the ledger.
    assert os.listdir(os.path.join(ledger.root, "work")) == [] and ledger.records() == []


def weakened(change: Callable[[dict], None]) -> Callable[[LaunchRequest], dict]:
    def enforce(request: LaunchRequest) -> dict:
        enforced = enforced_for(request)
        change(enforced)
        return enforced
    return enforce


def _set(*keys: str, value: object) -> Callable[[dict], None]:
    def change(enforced: dict) -> None:
        for key in keys[:-1]:
            enforced = enforced[key]
        enforced[keys[-1]] = value
    return change


@pytest.mark.parametrize("enforce, reason, stage, fact", [
    (lambda r: enforced_for(r, tokens.ChildToken(False, True, PACKAGE, 0)),
     "job_not_enforced", "job", "in_job"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, False, "", 0)),
     "identity_not_enforced", "identity", "appcontainer_token"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, True, PACKAGE[:-1] + "0", 0)),
     "identity_not_enforced", "identity", "launch_package_sid"),
    (lambda r: enforced_for(r, tokens.ChildToken(True, True, PACKAGE, 2)),
     "identity_not_enforced", "identity", "capabilities"),
    (weakened(lambda e: e.pop("verified")), "identity_not_enforced", "identity",
     "appcontainer_token"),
    (weakened(_set("job", "breakaway", value=True)), "job_not_enforced", "job",
     "job_breakaway"),
    (weakened(_set("job", "kill_on_close", value=False)), "job_not_enforced", "job",
     "job_kill_on_close"),
    (weakened(_set("job", "ui_restrictions", value="0x1")), "job_not_enforced", "job",
     "job_ui_restrictions"),
    (weakened(_set("desktop", value="default")), "desktop_not_enforced", "desktop",
     "private_desktop"),
    (weakened(_set("handles", value="all inheritable")), "handles_not_enforced", "handles",
     "inherited_handles"),
    (weakened(_set("filesystem", "overrides", value=0)), "filesystem_not_enforced",
     "filesystem", "acl_overrides"),
    (weakened(_set("mitigations", value=0)), "filesystem_not_enforced", "filesystem",
     "no_low_label_images"),
    (weakened(_set("job", "memory", value=0)), "limits_not_enforced", "limits", "job_memory"),
    (weakened(_set("limits", value={})), "limits_not_enforced", "limits", "timeout"),
])
def test_a_fact_that_does_not_hold_fails_readiness_at_its_stage(ledger, host, enforce, reason,
                                                                stage, fact):
    a = probed(FakeWindowsBackend(enforce), ledger, host)
    assert (a.ready, a.reason, a.stage) == (False, reason, stage)
    assert a.message.startswith(f"{fact}: observed ")


def test_a_job_that_allows_breakaway_is_seen_in_the_jobs_own_facts():
    plan = job.job_plan(LaunchRequest(argv=("x",), cwd="C:\\", env=()).limits, cpus=4)
    assert job.applied(plan) == {
        "kill_on_close": True, "breakaway": False, "die_on_unhandled_exception": True,
        "ui_restrictions": "all", "memory": 0, "active_processes": 0, "cpu_rate": None}
    leaky = replace(plan, limit_flags=plan.limit_flags | 0x800)  # JOB_OBJECT_LIMIT_BREAKAWAY_OK
    assert job.applied(leaky)["breakaway"] is True


def test_token_facts_name_no_sid():
    observed = tokens.ChildToken(True, True, PACKAGE.lower(), 0)
    assert observed.refusal(PACKAGE) is None
    assert observed.facts(PACKAGE) == {"in_job": True, "appcontainer_token": True,
                                       "launch_package_sid": True, "capabilities": 0}
    other = tokens.ChildToken(True, True, PACKAGE[:-1] + "0", 0)
    assert "not the launch's" in other.refusal(PACKAGE)
    assert other.facts(PACKAGE)["launch_package_sid"] is False


# --- lifetime ----------------------------------------------------------------------------------


def test_a_profile_left_behind_fails_the_lifetime_stage(ledger, host):
    host.profile_left_over = True
    a = probed(FakeWindowsBackend(), ledger, host)
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


def test_the_platform_half_is_chosen_by_backend_name():
    from stockade.linux.backend import LinuxBackend

    assert isinstance(platform_probe(WindowsBackend()), windows_probe.WindowsProbe)
    assert isinstance(platform_probe(FakeWindowsBackend()), windows_probe.WindowsProbe)
    assert isinstance(platform_probe(LinuxBackend()), LinuxProbe)


def test_a_windows_pass_is_cached_per_process_and_not_stored(monkeypatch, tmp_path):
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(probe_module, "_cache", {})
    calls = []

    def scripted(backend, ledger=None):
        calls.append(backend.name)
        return probe_module.Attestation(
            ready=True, backend=backend.name, run_as="unelevated", versions={}, facts={},
            enforced={}, timings={}, duration_ms=1.0)

    monkeypatch.setattr(probe_module, "probe", scripted)
    for _ in range(2):
        assert probe_module.require_ready(FakeWindowsBackend()).ready
    assert calls == ["windows"]
    monkeypatch.setattr(probe_module, "_cache", {})  # as if a new process
    assert probe_module.require_ready(FakeWindowsBackend()).ready
    assert calls == ["windows", "windows"]
    assert not (tmp_path / "state" / "attestation-windows.json").exists()


# --- the report --------------------------------------------------------------------------------

CAPABILITIES = [
    "identity", "filesystem.read", "filesystem.write", "filesystem.deny",
    "filesystem.protected", "filesystem.git", "filesystem.exec_from_write", "filesystem.links",
    "network.none", "network.loopback", "network.link_local", "network.listeners",
    "network.inherited_handles", "network.allowlist", "network.any", "env",
    "limits.memory", "limits.pids", "limits.file_size", "limits.cpu", "limits.timeout",
    "limits.output", "kill_on_close", "desktop", "ui_restrictions", "settlement",
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
    for name in ("identity", "filesystem.write", "filesystem.deny", "filesystem.links",
                 "network.none", "network.loopback", "network.link_local",
                 "network.inherited_handles", "limits.memory", "limits.pids", "limits.timeout",
                 "limits.output", "kill_on_close", "desktop", "ui_restrictions", "settlement"):
        assert status[name] == "enforced", name
    # Enforced, with what it does not cover.
    assert "interpreter" in rows["filesystem.exec_from_write"].reason
    assert status["filesystem.exec_from_write"] == "enforced"
    # Partial: every AppContainer reads ALL APPLICATION PACKAGES; listening sockets unverified.
    assert status["filesystem.read"] == "partial"
    assert "ALL APPLICATION PACKAGES" in rows["filesystem.read"].reason
    assert status["filesystem.protected"] == status["network.listeners"] == "partial"
    assert "listening socket" in rows["network.listeners"].reason
    assert status["env"] == status["limits.cpu"] == "partial"
    # Unavailable, with the backend's own reasons.
    for name in ("network.allowlist", "network.any", "limits.file_size"):
        assert status[name] == "unavailable", name
    assert "link-local" in rows["network.any"].reason
    assert "`any` is refused" in rows["network.link_local"].reason
    assert "per-file size" in rows["limits.file_size"].reason


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


def test_nothing_unverified_is_enforced_on_windows():
    failed = stockade.Attestation(
        ready=False, backend="windows", run_as="unelevated", versions={}, facts={},
        enforced={}, timings={}, duration_ms=0.0, reason="windows_setup_failed",
        stage="launch", message="a Win32 call failed while setting up the probe sandbox")
    built = report.build(failed, WindowsBackend())
    assert all(row.status != "enforced" for row in built.rows)


# --- on Windows: the real probe ----------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "win32",
                    reason="the real Windows probe needs Windows (an AppContainer, a Job Object, "
                           "NTFS ACLs, a desktop)")
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
    assert rows["network.any"] == "unavailable"
