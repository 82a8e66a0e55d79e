"""The host's keeper of its Windows Sandbox guest (docs/windows-sandbox.md): boots one on demand,
lends it to one execution at a time, keeps it for the next execution that needs the same guest,
and tears it down once idle. Pure: what starts, attaches to and stops a guest comes in as
functions (wsb.py gives the real ones; tests, fakes), and so does the clock.

- **Reuse.** A guest offers what its plan made it (wsb_plan.Plan.shape: its mappings, network
  and limits, the host's filesystem as it was at boot). An execution whose plan has the same
  shape, planned afresh against the filesystem now, gets the idle guest; any other stops it and
  boots its own (one Windows Sandbox per host). A guest whose execution was killed or lost its
  session is not reused.
- **Idle teardown.** A guest idle for `idle` seconds is stopped (a thread looks a few times
  per period).
- **Bounded retries.** A guest that does not answer is stopped and another booted, `attempts`
  in all; then `session_boot_failed`, and for `cooldown` seconds every execution is refused at
  once (`session_boot_cooldown`) instead of booting again. A refusal (the policy, the guest's
  own refusal, `busy`) is not retried.
- **Zombies.** A guest whose VM did not end when stopped is kept and stopped again, by what
  this process started (the launcher's own process, never a process found by name), before any
  other boot; while one remains, a boot attempt fails (Windows runs one sandbox at a time).
- **One at a time.** An execution asking while another holds the guest (or is booting one) is
  refused at once, `busy`, as the host's lease refuses a second sandbox (wsb_lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from stockade.launch.request import LaunchRequest
from stockade.session import boot
from stockade.session.errors import SessionError

IDLE_TIMEOUT = 300.0  # seconds a guest is kept for the next execution
COOLDOWN = 60.0  # seconds no boot is tried after `attempts` failed in a row
BOOT_TIMEOUT = 300.0  # seconds from the launch to the agent's hello (a Windows guest is slow)
MAX_LOOK = 5.0  # seconds between the idle thread's looks, at most


class Guest(Protocol):
    """A started guest: its `shape` (what it can run), then its session once attached."""

    shape: tuple
    session: boot.Session

    def attach(self, timeout: float) -> None:
        """Wait for the agent's hello; SessionError `session_boot_failed` if it does not come
        (retried); anything else is a refusal (not retried)."""

    def alive(self) -> bool: ...

    def stop(self) -> bool:
        """Stop the guest's VM; whether it is gone."""


class Lease:
    """One execution's use of the guest, until `Daemon.release`."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest

    @property
    def session(self) -> boot.Session:
        return self.guest.session


class Daemon:
    def __init__(self, start: Callable[[LaunchRequest], Guest],
                 shape: Callable[[LaunchRequest], tuple], *, attempts: int = boot.BOOT_ATTEMPTS,
                 cooldown: float = COOLDOWN, idle: float = IDLE_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._start, self._shape = start, shape
        self.attempts, self.cooldown, self.idle = attempts, cooldown, idle
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = False  # an execution holds the guest, or a boot is under way
        self._held: Guest | None = None  # the guest an execution holds
        self._idle: Guest | None = None
        self._last_used = 0.0
        self._zombies: list[Guest] = []
        self._cooldown_until: float | None = None
        self._closed = threading.Event()
        self._looking: threading.Thread | None = None

    def acquire(self, request: LaunchRequest, *, timeout: float = BOOT_TIMEOUT,
                attempts: int | None = None, fresh: bool = False) -> Lease:
        """The guest for `request`: the idle one if its shape fits (and not `fresh`), else a
        new one."""
        wanted = self._shape(request)  # (first: a policy refused is refused before anything)
        with self._lock:
            if self._busy:
                raise SessionError("busy", "this process's Windows Sandbox is in use by "
                                   "another execution (one at a time)")
            if self._cooldown_until is not None and self._clock() < self._cooldown_until:
                left = self._cooldown_until - self._clock()
                raise SessionError("session_boot_cooldown", f"Windows Sandbox failed to boot "
                                   f"just now; no boot is tried for another {left:.0f}s")
            self._busy = True
            idle, self._idle = self._idle, None
        try:
            if idle is not None and not fresh and idle.shape == wanted and idle.alive():
                guest = idle
            else:
                if idle is not None:
                    self._stop(idle)
                guest = self._boot(request, timeout, attempts or self.attempts)
        except BaseException:
            with self._lock:
                self._busy = False
            raise
        with self._lock:
            self._held = guest
        return Lease(guest)

    def release(self, lease: Lease, *, reuse: bool) -> None:
        """The execution is over: keep its guest for the next (`reuse`, if it still runs),
        else stop it."""
        guest = lease.guest
        keep = reuse and not self._closed.is_set() and guest.alive()
        with self._lock:
            self._busy, self._held = False, None
            if keep:
                self._idle, self._last_used = guest, self._clock()
                self._look()
        if not keep:
            self._stop(guest)

    def reap(self) -> None:
        """Stop the idle guest once it has been idle for `idle` seconds."""
        with self._lock:
            guest = self._idle
            if guest is None or self._clock() - self._last_used < self.idle:
                return
            self._idle = None
        self._stop(guest)

    def close(self) -> None:
        """Stop every guest: idle, in use (its execution then fails) and zombie (at the
        process's exit: a Windows Sandbox outlives the process that started it)."""
        self._closed.set()
        with self._lock:
            guests, self._idle = [g for g in (self._idle, self._held) if g is not None], None
        for guest in guests:
            self._stop(guest)
        self._clean()

    @property
    def zombies(self) -> int:
        return len(self._zombies)

    @property
    def kept(self) -> Guest | None:
        """The idle guest kept for the next execution, if any."""
        return self._idle

    def _boot(self, request: LaunchRequest, timeout: float, attempts: int) -> Guest:
        failures = []
        for _ in range(attempts):
            if not self._clean():
                failures.append(f"a Windows Sandbox this process started is still running "
                                f"({self.zombies} not stopped)")
                continue
            guest = self._start(request)
            try:
                guest.attach(timeout)
            except SessionError as exc:
                self._stop(guest)
                if exc.code != "session_boot_failed":
                    raise
                failures.append(exc.message)
                continue
            except BaseException:
                self._stop(guest)
                raise
            with self._lock:
                self._cooldown_until = None
            return guest
        with self._lock:
            self._cooldown_until = self._clock() + self.cooldown
        raise SessionError("session_boot_failed", f"Windows Sandbox did not answer after "
                           f"{attempts} attempts ({failures[-1]}); no boot is tried for "
                           f"{self.cooldown:g}s")

    def _stop(self, guest: Guest) -> None:
        if not guest.stop():
            with self._lock:
                self._zombies.append(guest)

    def _clean(self) -> bool:
        """Stop every zombie again; whether none is left."""
        with self._lock:
            zombies, self._zombies = self._zombies, []
        left = [guest for guest in zombies if not guest.stop()]
        with self._lock:
            self._zombies += left
            return not self._zombies

    def _look(self) -> None:
        """(With the lock held.) The idle thread, started with the first guest kept."""
        if self._looking is None:
            self._looking = threading.Thread(target=self._keep_looking,
                                             name="stockade-wsb-idle", daemon=True)
            self._looking.start()

    def _keep_looking(self) -> None:
        while not self._closed.wait(min(self.idle / 4, MAX_LOOK)):
            self.reap()
