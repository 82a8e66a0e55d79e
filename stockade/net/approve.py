"""Approvals while a sandbox runs (issue 34 item 3, in part): the allowlist proxy asks the
caller about a destination its patterns do not allow, and goes on as answered.

Only a destination outside `network.allow` is asked about (`not_allowed`, `port_not_allowed`):
never one a deny pattern refuses, and an approval lifts no address check — a name that
resolves to a loopback, private or metadata address is refused as before. The caller's
function gets an `Ask` and answers `ALLOW_ONCE` (this connection), `ALLOW_RUN` (this host and
port for the rest of the run) or `DENY`; anything else, an exception, or no answer within
`timeout` seconds is a denial. The function runs in a thread of its own, one question at a
time, so a slow answer holds up only the connections waiting for one; a question whose
connection was denied by the timeout while it waited its turn is not asked, and past
`MAX_PENDING` questions waiting at once a new one is denied unasked. An `async def` function
(given to `arun` or `AsyncSandbox`) runs on the caller's event loop (`on_loop`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

ALLOW_ONCE, ALLOW_RUN, DENY = "allow-once", "allow-run", "deny"
ASKED = ("not_allowed", "port_not_allowed")  # the refusals an approval may lift
DEFAULT_TIMEOUT = 30.0
MAX_PENDING = 32  # questions asked or waiting at once; more are denied unasked


@dataclass(frozen=True)
class Ask:
    """A destination the policy does not allow: `reason` says why (a stable code), and
    `credentials` the `network.credentials` whose host it is (by name)."""

    host: str
    port: int
    reason: str
    credentials: tuple[str, ...] = ()


Approver = Callable[[Ask], str]


class Approval:
    """A caller's `approver`, bounded by `timeout`, with what it allowed for the run."""

    def __init__(self, approver: Approver, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.approver = approver
        self.timeout = timeout
        self._for_run: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._asking = threading.Lock()  # (one question at a time: a person answers them)
        self._pending = 0  # questions asked or waiting their turn
        self._closed = False
        self._waiting: set[threading.Event] = set()  # (each question's: set when it is over)
        self._answered = threading.Condition(self._lock)  # (told when a question is over)

    def close(self, settle: float = 1.0) -> None:
        """No more answers: what is asked or waiting its turn now is denied at once, and what
        is asked later is denied unasked (a Workspace's call has ended: issue 34, W2). Waits
        up to `settle` seconds for those denials to be handed back (so that they are decided
        before whatever comes next)."""
        with self._lock:
            self._closed = True
            for over in self._waiting:
                over.set()
            self._answered.wait_for(lambda: not self._waiting, settle)

    def answer(self, ask: Ask) -> str:
        """ALLOW_ONCE, ALLOW_RUN or DENY for `ask`."""
        over = threading.Event()
        with self._lock:
            if self._closed:
                return DENY
            if (ask.host, ask.port) in self._for_run:
                return ALLOW_RUN
            if self._pending >= MAX_PENDING:  # (a flood of questions: each a thread waiting)
                return DENY
            self._pending += 1
            self._waiting.add(over)
        answers: list[str] = []
        gone = threading.Event()

        def call() -> None:
            try:
                with self._asking:
                    with self._lock:  # (answered for the run while this one waited its turn)
                        if (ask.host, ask.port) in self._for_run:
                            answers.append(ALLOW_RUN)
                            return
                    if gone.is_set():  # (its connection was denied meanwhile: not asked)
                        return
                    try:
                        answers.append(self.approver(ask))
                    except Exception:  # noqa: BLE001 - the caller's code: a failure denies
                        answers.append(DENY)
            finally:
                with self._lock:
                    self._pending -= 1
                over.set()

        asker = threading.Thread(target=call, name="stockade-approve", daemon=True)
        asker.start()
        over.wait(self.timeout)
        gone.set()
        with self._lock:
            self._waiting.discard(over)
            self._answered.notify_all()
            answer = answers[0] if answers and answers[0] in (ALLOW_ONCE, ALLOW_RUN) \
                and not self._closed else DENY
            if answer == ALLOW_RUN:
                self._for_run.add((ask.host, ask.port))
        return answer


def on_loop(approver: Callable[[Ask], object]) -> Callable[[Ask], object]:
    """`approver` as the proxy's threads can call it: an `async def` one run on the event loop
    running now (call this from it), each answer awaited there; any other, itself."""
    import asyncio  # (here: only asyncio programs pay for it)
    import inspect

    if not inspect.iscoroutinefunction(approver):
        return approver
    loop = asyncio.get_running_loop()

    def ask(question: Ask) -> object:
        future = asyncio.run_coroutine_threadsafe(approver(question), loop)
        try:
            return future.result(DEFAULT_TIMEOUT * 10)  # (Approval's own timeout comes first)
        finally:
            future.cancel()  # (an answer not awaited to its end is not left running)
    return ask
