"""`stockade.AsyncSandbox`: the asyncio twin of Sandbox, a thin layer over it.

    >>> async with stockade.AsyncSandbox(preset="workspace-write") as sb:
    ...     result = await sb.run(["make"])
    ...     async for event in sb.stream(["make", "test"]):
    ...         print(event)

The blocking work runs in worker threads. Cancelling a task awaiting `run`, or leaving an
`async for` over `stream` early, cancels that command (its process tree is killed); the sandbox
stays usable.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from stockade.errors import UsageError
from stockade.launch.result import Result
from stockade.net.approve import on_loop
from stockade.session.exchange import Output
from stockade.session.sandbox import Sandbox

_END = object()


class AsyncSandbox:
    """Takes Sandbox's arguments; the sandbox boots in `async with` (or `await start()`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs
        self._sandbox: Sandbox | None = None

    async def start(self) -> AsyncSandbox:
        if self._sandbox is None:
            if self._kwargs.get("approve") is not None:  # (an async one: on this loop)
                self._kwargs["approve"] = on_loop(self._kwargs["approve"])
            self._sandbox = await asyncio.to_thread(Sandbox, *self._args, **self._kwargs)
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._sandbox is not None:
            await asyncio.to_thread(self._sandbox.close)

    async def run(self, args: Any, **kwargs: Any) -> Result:
        """Sandbox.run, awaited (same arguments): cancelling the awaiting task cancels the
        command, as setting `cancel` does."""
        sandbox = self._started()
        cancel = kwargs.pop("cancel", None) or threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(sandbox.run, args, cancel=cancel,
                                                       **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cancel.set()
            await asyncio.wait([task])  # the command is over before the cancellation goes on
            raise

    async def stream(self, args: Any, **kwargs: Any) -> AsyncIterator[Output | Result]:
        """Sandbox.stream, as an async iterator (same arguments): leaving the loop early
        cancels the command, as setting `cancel` does."""
        sandbox = self._started()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancel = kwargs.pop("cancel", None) or threading.Event()
        stream = sandbox.stream(args, cancel=cancel, **kwargs)  # (a mistake raises here)

        def pump() -> None:
            try:
                for event in stream:
                    loop.call_soon_threadsafe(events.put_nowait, event)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                loop.call_soon_threadsafe(events.put_nowait, exc)
            else:
                loop.call_soon_threadsafe(events.put_nowait, _END)

        worker = asyncio.ensure_future(asyncio.to_thread(pump))
        try:
            while (event := await events.get()) is not _END:
                if isinstance(event, BaseException):
                    raise event
                yield event
        finally:
            cancel.set()  # a no-op once the command has ended
            await asyncio.wait([worker])

    def _started(self) -> Sandbox:
        if self._sandbox is None:
            raise UsageError("use `async with AsyncSandbox(...)` or `await start()` first")
        return self._sandbox
