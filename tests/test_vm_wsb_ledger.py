"""Windows Sandbox guests in the launch ledger (stockade/vm/wsb_ledger.py): a guest is recorded
before its boot is waited for (WindowsSandbox.exe by its identity, procid.py; a guest of the
`wsb` tool by its id, before `wsb start`), and a guest left running by a process killed without
its exit handlers (a simulated crash: the guest started, the record's lease dropped as the
kernel drops a dead process's, nothing stopped) is ended by the next reconcile, `stockade
reconcile`'s or the next boot's — the very process recorded, never one that took its id since;
its per-boot folder removed. A live process's guest is never touched. Against fakes: the
process table (tests/windows_processes.py), the `wsb` tool, WindowsSandbox.exe's Popen."""

from __future__ import annotations

import os
import secrets
import subprocess
from types import SimpleNamespace

import pytest
from test_windows_fakes import bind_win32
from windows_like import run_as_windows
from windows_processes import Processes

from stockade.errors import SetupError
from stockade.launch.request import LaunchRequest
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import Ledger
from stockade.vm import wsb, wsb_launcher, wsb_ledger, wsb_plan
from stockade.windows import procid

EXE = wsb_launcher.Launcher(wsb_launcher.PROGRAM, "C:\\Windows\\System32\\WindowsSandbox.exe")
CLI = wsb_launcher.Launcher(wsb_launcher.CLI, "C:\\Windows\\System32\\wsb.exe")


class WsbTool:
    """The `wsb` command-line tool over the sandboxes it runs: `start`, `stop` and `list`
    (which prints each running sandbox's id, here in upper case)."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.calls: list[list[str]] = []
        self.list_fails = False
        self.stop_ignored = False
        self.on_start = lambda: None

    def __call__(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        verb = argv[1]
        if verb == "start":
            self.on_start()
            self.running.add(argv[3])
        elif verb == "stop" and not self.stop_ignored:
            self.running.discard(argv[3])
        elif verb == "list":
            listed = "\n".join(f'{{"Id": "{guid.upper()}"}}' for guid in sorted(self.running))
            return subprocess.CompletedProcess(argv, 1 if self.list_fails else 0,
                                               listed.encode(), b"")
        return subprocess.CompletedProcess(argv, 0, b"", b"")


class Host:
    """This host as WsbGuest.start and the reconcile meet it: its processes (WindowsSandbox.exe
    among them, started by a Popen of its own), the `wsb` tool, a state directory."""

    def __init__(self, monkeypatch, tmp_path) -> None:
        self.processes = Processes()
        self.tool = WsbTool()
        self.popens: list[FakePopen] = []
        bind_win32(monkeypatch, self.processes, procid)
        monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
        monkeypatch.setattr(wsb, "subprocess", SimpleNamespace(
            Popen=self.popen, run=self.tool, DEVNULL=subprocess.DEVNULL,
            TimeoutExpired=subprocess.TimeoutExpired))
        monkeypatch.setattr(wsb_ledger, "_run", self.tool)
        monkeypatch.setattr(wsb_launcher, "here", lambda: self.launcher)
        self.launcher = EXE

    def popen(self, argv: list[str], **kwargs) -> FakePopen:
        assert argv[0] == EXE.program
        self.popens.append(FakePopen(self.processes))
        return self.popens[-1]

    def guest(self, launcher: wsb_launcher.Launcher | None = None) -> wsb.WsbGuest:
        boot_id = secrets.token_hex(16)
        plan = wsb_plan.Plan((), (), (), "none", None, None, boot_id)
        return wsb.WsbGuest(LaunchRequest(argv=("agent",), cwd="C:\\", env=()), plan,
                            launcher or self.launcher, wsb_ledger.workdir(boot_id))


class FakePopen:
    """subprocess.Popen of WindowsSandbox.exe: a process of the model, held while this lives."""

    def __init__(self, processes: Processes) -> None:
        self.processes = processes
        self.process = processes.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return None if self.process.running else 1

    def kill(self) -> None:
        if self.process.running and not self.process.stubborn:
            self.process.running = False

    def wait(self, timeout: float | None = None) -> int | None:
        return self.poll()


@pytest.fixture
def host(monkeypatch, tmp_path) -> Host:
    monkeypatch.setattr(removers, "REMOVERS", dict(removers.REMOVERS))
    monkeypatch.setattr(removers, "_VALIDATORS", dict(removers._VALIDATORS))
    wsb_ledger.register_kinds()  # (as `registry.load_record_kinds` does on Windows)
    return Host(monkeypatch, tmp_path)


def crash(guest: wsb.WsbGuest) -> None:
    """The process that started `guest` is killed without its exit handlers: nothing is
    stopped; the kernel drops its leases (its record's, the host's Windows Sandbox lease)."""
    guest.record.abandon()
    guest._lock.release()


# --- WindowsSandbox.exe -----------------------------------------------------------------------


def test_a_guest_is_recorded_by_its_process_identity_once_started(host):
    guest = host.guest()
    guest.start()
    (popen,) = host.popens
    with open(guest.record.path) as f:
        recorded = f.read().splitlines()[1]
    assert f'"name":"{guest.plan.boot_id}"' in recorded and '"kind":"wsbguest"' in recorded
    assert f'"pid":{popen.pid}' in recorded and f'"created":{popen.process.created}' in recorded
    assert Ledger().reconcile().live == 1 and popen.process.running  # (its process is alive)
    popen.process.running = False
    assert guest.stop() and Ledger().records() == [] and not os.path.exists(guest.workdir)


def test_a_guest_whose_process_was_killed_is_ended_by_the_next_reconcile(host):
    guest = host.guest()
    guest.start()
    (popen,) = host.popens
    crash(guest)
    assert popen.process.running and os.path.isdir(guest.workdir)
    done = Ledger().reconcile()
    assert (done.reconciled, done.failed) == (1, 0)
    assert done.removed == [(wsb_ledger.KIND, guest.plan.boot_id)]
    assert not popen.process.running and popen.process.terminated == 1
    assert not os.path.exists(guest.workdir) and Ledger().records() == []


def test_a_process_that_took_the_guests_id_is_never_ended(host):
    guest = host.guest()
    guest.start()
    (popen,) = host.popens
    crash(guest)
    host.processes.exit(popen.process)  # (the sandbox ended by itself, its handle closed)
    host.popens.clear()
    later = host.processes.start(pid=popen.pid)  # and its id handed out again
    done = Ledger().reconcile()
    assert (done.reconciled, done.failed) == (1, 0) and Ledger().records() == []
    assert later.running and later.terminated == 0


def test_a_windowssandbox_that_will_not_end_keeps_its_record(host):
    guest = host.guest()
    guest.start()
    (popen,) = host.popens
    popen.process.stubborn = True
    crash(guest)
    done = Ledger().reconcile()
    assert (done.reconciled, done.failed) == (0, 1) and Ledger().records()
    assert os.path.isdir(guest.workdir)  # (its mappings stay while the guest runs)
    popen.process.stubborn = False
    assert Ledger().reconcile().reconciled == 1 and not popen.process.running


def test_the_next_boot_ends_a_dead_processs_guest_first(host, monkeypatch):
    """One Windows Sandbox runs per host: the guest a killed process left would fail the boot."""
    left = host.guest()
    left.start()
    crash(left)
    (dead,) = host.popens
    monkeypatch.setattr(wsb, "_plan", lambda request, workdir, boot_id, port: wsb_plan.Plan(
        (), (), (), "none", None, None, boot_id))
    seen = []
    monkeypatch.setattr(wsb.WsbGuest, "start", lambda guest: seen.append(dead.process.running))
    wsb.start_guest(LaunchRequest(argv=("agent",), cwd="C:\\", env=()))
    assert seen == [False] and Ledger().records() == []


# --- the `wsb` tool ---------------------------------------------------------------------------


def test_a_guest_of_the_wsb_tool_is_recorded_before_it_starts(host):
    host.launcher = CLI
    guest = host.guest()
    host.tool.on_start = lambda: seen.append(Ledger().records())
    seen: list = []
    guest.start()
    assert seen == [[os.path.basename(guest.record.path)]]
    crash(guest)
    done = Ledger().reconcile()
    assert done.removed == [(wsb_ledger.KIND, guest.plan.boot_id)] and host.tool.running == set()
    assert ["stop", "--id", guest.sandbox_id] == host.tool.calls[-2][1:]


def test_a_failed_wsb_start_leaves_no_record(host):
    host.launcher = CLI
    guest = host.guest()

    def failing(argv, **kwargs):
        if argv[1] == "start":
            return subprocess.CompletedProcess(argv, 3, b"", b"not enabled")
        return host.tool(argv)

    wsb.subprocess.run = failing
    with pytest.raises(SetupError) as failed:
        guest.start()
    assert failed.value.code == "windows_sandbox_start_failed"
    assert Ledger().records() == [] and not os.path.exists(guest.workdir)


@pytest.mark.parametrize("trouble", ["list-fails", "stop-ignored", "tool-gone"])
def test_a_guest_of_the_wsb_tool_that_cannot_be_seen_stopped_keeps_its_record(host, trouble):
    host.launcher = CLI
    guest = host.guest()
    guest.start()
    crash(guest)
    host.tool.list_fails = trouble == "list-fails"
    host.tool.stop_ignored = trouble == "stop-ignored"
    if trouble == "tool-gone":
        host.launcher = EXE
    done = Ledger().reconcile()
    assert (done.reconciled, done.failed) == (0, 1) and Ledger().records()
    assert host.tool.running == {guest.sandbox_id} and os.path.isdir(guest.workdir)


def test_a_guest_the_wsb_tool_no_longer_lists_is_gone(host):
    host.launcher = CLI
    guest = host.guest()
    guest.start()
    crash(guest)
    host.tool.running.clear()  # (ended by itself)
    done = Ledger().reconcile()
    assert done.reconciled == 1 and not any(call[1] == "stop" for call in host.tool.calls)


# --- the records --------------------------------------------------------------------------------


BOOT_ID = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(("name", "detail"), [
    (BOOT_ID[:-1], wsb_ledger.BY_ID),
    (BOOT_ID.upper(), wsb_ledger.BY_ID),
    ("..\\" + BOOT_ID[3:], wsb_ledger.BY_ID),
    (BOOT_ID, {"launcher": "wsb", "pid": 4}),
    (BOOT_ID, {"launcher": "exe"}),
    (BOOT_ID, {"launcher": "exe", "pid": 4, "created": "1"}),
    (BOOT_ID, {"launcher": "exe", "pid": 0, "created": 1}),
    (BOOT_ID, {"launcher": "exe", "pid": True, "created": 1}),
    (BOOT_ID, {"launcher": "exe", "pid": 4, "created": 1, "program": "C:\\x.exe"}),
    (BOOT_ID, {"launcher": "cmd", "pid": 4, "created": 1}),
])
def test_records_the_remover_could_not_act_on_safely_are_refused(name, detail):
    with pytest.raises(ValueError):
        wsb_ledger.validate(name, detail)
    wsb_ledger.validate(BOOT_ID, {"launcher": "exe", "pid": 4, "created": 1})
    wsb_ledger.validate(BOOT_ID, wsb_ledger.BY_ID)


def test_on_windows_a_reconcile_knows_the_guests_and_the_manifests():
    # (the Windows-like interpreter: registration as `stockade reconcile` does it there)
    out = run_as_windows("""
        from stockade.launch import registry
        from stockade.lifecycle import removers
        registry.load_record_kinds()
        print(" ".join(sorted(removers.REMOVERS)))
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert {"wsbguest", "brokermanifest"} <= set(out.stdout.split())
