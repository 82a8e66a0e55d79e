"""A Windows process by its identity (stockade/windows/procid.py), over the model of this host's
processes (tests/windows_processes.py): the process recorded, never one that took its id since;
one that has ended is not running even while a handle keeps it; one that cannot be opened is an
error, never taken for gone (a ledger reconcile then keeps its record)."""

from __future__ import annotations

import pytest
from test_windows_fakes import bind_win32
from windows_processes import Processes

from stockade.windows import procid


@pytest.fixture
def processes(monkeypatch) -> Processes:
    model = Processes()
    bind_win32(monkeypatch, model, procid)
    return model


def test_the_recorded_process_runs_until_it_ends(processes):
    recorded = processes.start()
    assert procid.created(recorded.pid) == recorded.created
    assert procid.running(recorded.pid, recorded.created)
    held = processes.OpenProcess(procid.c.SYNCHRONIZE, False, recorded.pid)
    processes.exit(recorded)  # (ended; its object kept by the handle held)
    assert not procid.running(recorded.pid, recorded.created)
    processes.CloseHandle(held)
    assert not procid.running(recorded.pid, recorded.created)
    assert processes.handles == {}


def test_a_process_that_took_the_id_is_not_the_recorded_one(processes):
    recorded = processes.start()
    processes.exit(recorded)
    later = processes.start(pid=recorded.pid)
    assert not procid.running(recorded.pid, recorded.created)
    assert procid.end(recorded.pid, recorded.created) is True  # (the recorded one is gone)
    assert later.running and later.terminated == 0


def test_ending_ends_the_recorded_process_and_waits_for_it(processes):
    recorded = processes.start()
    assert procid.end(recorded.pid, recorded.created) is True
    assert not recorded.running and recorded.terminated == 1
    assert procid.end(recorded.pid, recorded.created) is True  # (gone: nothing to do)
    stubborn = processes.start(stubborn=True)
    assert procid.end(stubborn.pid, stubborn.created) is False and stubborn.running
    assert processes.handles == {}


def test_a_process_that_cannot_be_opened_is_not_taken_for_gone(processes):
    foreign = processes.start(foreign=True)
    for ask in (procid.running, procid.end):
        with pytest.raises(OSError):
            ask(foreign.pid, foreign.created)
    assert foreign.running
