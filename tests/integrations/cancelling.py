"""What each adapter's cancellation test checks, through its framework's own cancellation path:
a command (a tree: a plain and a setsid'd `sleep MARKER`, MARKER a unique duration of about
30 s) runs in a Workspace of ONE sandbox slot; once the framework cancels it, no process of it
is left on the host within GONE_WITHIN seconds (host /proc), and the slot is free: the next
call runs at once. Before cancellation reached the sandbox, the tree ran its 30 s and the next
call waited for it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from conftest import gone, marked

from stockade.integrations import workspace

GONE_WITHIN = 2.0  # seconds from the cancellation until no process of the command is left
NEXT_WITHIN = 2.0  # seconds the next call may take (a warm sandbox's `true`)
_serial = itertools.count()


def one_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workspaces made from now on in this test run one sandbox at a time: a slot the
    cancelled command kept would hold up the next call."""
    monkeypatch.setattr(workspace, "MAX_SANDBOXES", 1)


def tree() -> tuple[str, str]:
    """(a shell command that runs a tree of two processes for about 30 s, its MARKER)."""
    marker = f"30.{next(_serial)}{os.getpid()}"
    return f"setsid sleep {marker} & sleep {marker}; wait", marker


def running(marker: str, within: float = 30.0) -> None:
    """Waits (blocking) until the tree is up: both processes."""
    deadline = time.monotonic() + within
    while len(marked(marker)) < 2:
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)


async def arunning(marker: str) -> None:
    """`running`, awaited (the event loop goes on meanwhile)."""
    await asyncio.to_thread(running, marker)


def check_cancelled(run: Callable[[], Awaitable[object]], marker: str) -> None:
    """Runs `run()` (a framework's run) as an asyncio task, cancels the task once the command
    runs, and checks the command is gone (while the event loop still runs: closing it waits
    for its worker threads, so for a command that ran on)."""
    async def cancel() -> None:
        task = asyncio.ensure_future(run())
        await arunning(marker)
        task.cancel()
        cancelled_at = time.monotonic()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(check_gone, marker, cancelled_at)
    asyncio.run(cancel())


def check_gone(marker: str, cancelled_at: float) -> None:
    """No process of the command is left within GONE_WITHIN of `cancelled_at`."""
    assert gone(marker, within=max(0.0, cancelled_at + GONE_WITHIN - time.monotonic())), \
        f"left running {time.monotonic() - cancelled_at:.1f} s after the cancellation: " \
        f"{marked(marker)}"


def check_next_call(call: Callable[[], object]) -> None:
    """`call()` (the next command) completes within NEXT_WITHIN: the slot is free."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (call(), done.set()), daemon=True)
    thread.start()
    assert done.wait(NEXT_WITHIN), "the next call waited: the cancelled command kept its slot"
