"""The host's keeper of its Windows Sandbox guest (stockade/vm/wsb_daemon.py), its state machine
against fake guests and a fake clock: a guest booted on demand and reused by the next execution
of the same shape, another shape booting its own, a killed execution's guest stopped, idle
teardown, at most `attempts` boots, the cooldown after they all failed, refusals not retried,
zombies (a VM that did not end) stopped again by what this process started before any other
boot, one execution at a time, and everything stopped at the process's exit. Then the real
daemon's guest (stockade/vm/wsb.py) whose process will not end, as a zombie. Pure logic: the
real guests need Windows (docs/windows-sandbox.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stockade.errors import UnenforceableError
from stockade.launch.request import LaunchRequest
from stockade.session.errors import SessionError
from stockade.vm import wsb, wsb_daemon


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeGuest:
    """A guest whose attach answers (or not), and whose VM ends when stopped (or not)."""

    def __init__(self, shape: tuple, answers: bool | Exception, ends: int) -> None:
        self.shape = shape
        self.answers, self.ends = answers, ends  # ends: the stop that ends it (1: the first)
        self.session = object()
        self.stops = 0
        self.running = True

    def attach(self, timeout: float) -> None:
        if isinstance(self.answers, Exception):
            raise self.answers
        if not self.answers:
            raise SessionError("session_boot_failed", "no rendezvous from the guest")

    def alive(self) -> bool:
        return self.running

    def stop(self) -> bool:
        self.stops += 1
        self.running = self.running and self.stops < self.ends
        return not self.running


class Host:
    """What the daemon starts: guests made from a script of (answers, ends), in order."""

    def __init__(self, *script: tuple[bool | Exception, int]) -> None:
        self.script = list(script)
        self.started: list[FakeGuest] = []

    def start(self, request: LaunchRequest) -> FakeGuest:
        answers, ends = self.script.pop(0) if self.script else (True, 1)
        guest = FakeGuest(shape(request), answers, ends)
        self.started.append(guest)
        return guest


def shape(request: LaunchRequest) -> tuple:
    if request.cwd == "refused":
        raise UnenforceableError("filesystem.path", "refused by the plan")
    return (request.cwd,)


def request(cwd: str = "C:\\ws") -> LaunchRequest:
    return LaunchRequest(argv=("agent",), cwd=cwd, env=())


@pytest.fixture
def clock():
    return Clock()


def daemon(host: Host, clock: Clock, **changes) -> wsb_daemon.Daemon:
    made = wsb_daemon.Daemon(host.start, shape, clock=clock,
                             **({"cooldown": 60.0, "idle": 300.0} | changes))
    return made


def test_a_guest_is_booted_on_demand_and_reused_by_the_next_execution(clock):
    host = Host()
    keeper = daemon(host, clock)
    first = keeper.acquire(request())
    assert keeper.kept is None  # (in use: not idle)
    keeper.release(first, reuse=True)
    assert keeper.kept is first.guest
    second = keeper.acquire(request())
    assert second.guest is first.guest and len(host.started) == 1
    keeper.release(second, reuse=True)
    assert first.guest.stops == 0
    keeper.close()
    assert first.guest.stops == 1 and not first.guest.running


def test_another_shape_stops_the_idle_guest_and_boots_its_own(clock):
    host = Host()
    keeper = daemon(host, clock)
    first = keeper.acquire(request("C:\\one"))
    keeper.release(first, reuse=True)
    second = keeper.acquire(request("C:\\two"))
    assert second.guest is not first.guest and not first.guest.running
    assert len(host.started) == 2


def test_a_fresh_guest_is_never_a_kept_one(clock):
    host = Host()
    keeper = daemon(host, clock)
    first = keeper.acquire(request())
    keeper.release(first, reuse=True)
    second = keeper.acquire(request(), fresh=True)
    assert second.guest is not first.guest and not first.guest.running


@pytest.mark.parametrize("reuse", [False, True])
def test_a_guest_not_handed_back_for_reuse_or_ended_is_stopped(clock, reuse):
    host = Host()
    keeper = daemon(host, clock)
    lease = keeper.acquire(request())
    if reuse:
        lease.guest.running = False  # (its VM ended under it)
    keeper.release(lease, reuse=reuse)
    again = keeper.acquire(request())
    assert again.guest is not lease.guest and len(host.started) == 2


def test_an_idle_guest_is_torn_down_after_the_idle_timeout(clock):
    host = Host()
    keeper = daemon(host, clock, idle=300.0)
    lease = keeper.acquire(request())
    keeper.release(lease, reuse=True)
    clock.now += 299
    keeper.reap()
    assert lease.guest.running
    clock.now += 1
    keeper.reap()
    assert not lease.guest.running
    assert keeper.acquire(request()).guest is not lease.guest


def test_a_guest_in_use_is_never_torn_down_as_idle(clock):
    keeper = daemon(Host(), clock)
    lease = keeper.acquire(request())
    clock.now += 10_000
    keeper.reap()
    assert lease.guest.running


def test_a_guest_that_does_not_answer_is_retried_at_most_attempts_times(clock):
    host = Host((False, 1), (False, 1), (True, 1))
    keeper = daemon(host, clock)
    lease = keeper.acquire(request())
    assert lease.guest is host.started[2]
    assert [g.running for g in host.started] == [False, False, True]


def test_after_every_attempt_failed_boots_cool_down(clock):
    host = Host(*[(False, 1)] * 3)
    keeper = daemon(host, clock, cooldown=60.0)
    with pytest.raises(SessionError) as info:
        keeper.acquire(request())
    assert info.value.code == "session_boot_failed" and "3 attempts" in info.value.message
    assert len(host.started) == 3  # the bound: never a fourth
    clock.now += 59
    with pytest.raises(SessionError) as info:
        keeper.acquire(request())
    assert info.value.code == "session_boot_cooldown"
    assert len(host.started) == 3  # refused at once: nothing booted during the cooldown
    clock.now += 1
    assert keeper.acquire(request()).guest is host.started[3]


def test_a_refusal_is_not_retried_and_does_not_cool_down(clock):
    host = Host((SessionError("firewall_unverified", "profile Public is not locked"), 1))
    keeper = daemon(host, clock)
    with pytest.raises(SessionError) as info:
        keeper.acquire(request())
    assert info.value.code == "firewall_unverified"
    assert len(host.started) == 1 and not host.started[0].running
    keeper.acquire(request())  # (no cooldown)
    with pytest.raises(UnenforceableError):  # a plan refused: nothing is started
        daemon(host, clock).acquire(request("refused"))
    assert len(host.started) == 2


def test_a_zombie_is_stopped_again_before_any_other_boot(clock):
    host = Host((False, 3), (True, 1))  # the first guest's VM ends only at its third stop
    keeper = daemon(host, clock)
    lease = keeper.acquire(request())
    zombie = host.started[0]
    assert zombie.stops == 3 and not zombie.running and keeper.zombies == 0
    # (attempt 2 found it still running and started nothing; attempt 3 stopped it, then booted)
    assert len(host.started) == 2 and lease.guest is host.started[1]


def test_while_a_zombie_remains_no_guest_is_booted(clock):
    host = Host((False, 99))  # a VM that never ends
    keeper = daemon(host, clock)
    with pytest.raises(SessionError) as info:
        keeper.acquire(request())
    assert info.value.code == "session_boot_failed" and "still running" in info.value.message
    assert len(host.started) == 1 and keeper.zombies == 1  # no second sandbox beside it


def test_one_execution_at_a_time(clock):
    keeper = daemon(Host(), clock)
    lease = keeper.acquire(request())
    with pytest.raises(SessionError) as info:
        keeper.acquire(request())
    assert info.value.code == "busy"
    keeper.release(lease, reuse=True)
    assert keeper.acquire(request()).guest is lease.guest


def test_the_processs_exit_stops_every_guest(clock):
    host = Host((False, 2), (True, 1))
    keeper = daemon(host, clock)
    lease = keeper.acquire(request())
    keeper.close()
    assert not lease.guest.running and keeper.zombies == 0
    assert all(not g.running for g in host.started)
    keeper.release(lease, reuse=True)  # (after the exit began: stopped, never kept)
    assert lease.guest.stops >= 1


# --- the real guest's stop: by the process it started ------------------------------------------

def test_a_windowssandbox_process_that_will_not_end_is_a_zombie_until_it_does(tmp_path,
                                                                            monkeypatch):
    """WsbGuest.stop ends the launcher's own process (never one found by name) and says the VM
    is gone only once that process has exited."""
    from stockade.vm import wsb_launcher, wsb_lock, wsb_plan

    monkeypatch.setattr(wsb, "STOP_TIMEOUT", 0.5)
    stubborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plan = wsb_plan.Plan((), (), (), "none", None, None, "0" * 32)
    guest = wsb.WsbGuest(request(), plan, wsb_launcher.Launcher("exe", "WindowsSandbox.exe"),
                         str(tmp_path / "boot"))
    guest.process = stubborn
    guest._lock = wsb_lock.acquire(str(tmp_path / "lock"))
    killed = []
    monkeypatch.setattr(stubborn, "kill", lambda: killed.append(stubborn.pid))
    assert guest.stop() is False and killed == [stubborn.pid]  # asked to end, still running
    monkeypatch.undo()
    assert guest.stop() is True and stubborn.poll() is not None  # ended: gone
    wsb_lock.acquire(str(tmp_path / "lock")).release()  # the host's lease dropped with it
