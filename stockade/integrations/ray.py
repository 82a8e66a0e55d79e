"""A pool of warm Stockade sandboxes spread over a Ray cluster (the `ray` extra): each actor
owns a Workspace (a warm sandbox over one directory, the policy fixed when the pool is made),
and the pool spreads commands and file operations over them.

    >>> with SandboxPool(4, preset="workspace-write", workspace="/data/task") as pool:
    ...     tasks = [pool.submit(["python3", "eval.py", str(seed)]) for seed in range(100)]
    ...     outcomes = [task.result() for task in tasks]

What it adds to Ray: back-pressure (`submit` waits while every actor has `max_pending`
commands in flight), a per-task timeout that can only shorten the policy's `limits.timeout`
(the sandbox kills the command's whole tree, exit 124), cancellation (`Task.cancel`: the
command's tree is killed within a second, the actor's sandbox freed), and denials as data
(each Outcome's `denials`, with the grant that would allow them). A task whose actor or node
dies fails typed (`PoolError` `task_lost`): the sandbox died with the actor's process and
everything in it; Ray restarts the actor (on another node if its own is gone) and the pool
goes on. No scheduler of Stockade's own: Ray places the actors (SPREAD by default)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray
import ray.exceptions

from stockade.errors import StockadeError
from stockade.integrations.workspace import Outcome, Workspace
from stockade.launch.denials import Denial
from stockade.policy import Policy


class PoolError(StockadeError):
    """A task that did not finish: `task_lost` (its actor or node died; the sandbox with it),
    `cancelled`, or `timeout` (the result was not there within `result(timeout=...)`); or
    `actor_failed` (`ready()`: an actor died for good, its creation failed)."""


class SandboxActor:
    """One warm Workspace in a Ray worker process (an async actor: a cancelled call cancels
    the awaited command, which kills its tree)."""

    def __init__(self, policy: Policy | None, preset: str | None, workspace: str) -> None:
        self.workspace = Workspace(policy, preset=preset, workspace=workspace)
        self.workspace.start()

    async def exec(self, command: Sequence[str] | str, shell: bool, timeout: float | None,
                   input: bytes | str | None) -> dict:
        return (await self.workspace.aexec(command, shell=shell, timeout=timeout,
                                           input=input)).to_json()

    async def read_file(self, path: str) -> bytes:
        import anyio

        return await anyio.to_thread.run_sync(self.workspace.read_file, path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        import anyio

        await anyio.to_thread.run_sync(self.workspace.write_file, path, data)

    async def where(self) -> tuple[str, int]:
        """The node this actor runs on, and its process."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    async def close(self) -> None:
        self.workspace.close()


class Task:
    """One submitted call: `result()` waits for it, `cancel()` kills its command."""

    def __init__(self, ref: ray.ObjectRef, actor: int, done: Any) -> None:
        self.ref, self.actor = ref, actor
        ref.future().add_done_callback(lambda _: done(actor))

    def result(self, timeout: float | None = None) -> Any:
        """The call's value (an Outcome for a command); PoolError, or the refusal the call
        raised (FileError, UsageError)."""
        try:
            value = ray.get(self.ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise PoolError("timeout", f"no result within {timeout}s (the task goes on; "
                            "cancel() ends it)") from None
        except ray.exceptions.TaskCancelledError:
            raise PoolError("cancelled", "the task was cancelled: its command's process "
                            "tree was killed") from None
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, StockadeError):  # (a refusal: FileError, UsageError)
                raise exc.cause from None
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError,
                ray.exceptions.WorkerCrashedError) as exc:
            raise PoolError("task_lost", f"the task's actor died ({type(exc).__name__}): "
                            "its sandbox died with it; the actor is restarted") from None
        if isinstance(value, dict) and "exit_code" in value:
            return Outcome(**{**value, "denials": tuple(Denial(**d)
                                                        for d in value["denials"])})
        return value

    def cancel(self) -> None:
        ray.cancel(self.ref)


class SandboxPool:
    """`size` SandboxActors under one policy (`policy`, or `preset`; default
    workspace-write) over `workspace` (a directory every node has; default: the current
    one), spread by Ray. At most `max_pending` calls in flight per actor: `submit` waits
    for a free one (back-pressure). `actor_options` go to Ray (`num_cpus`,
    `scheduling_strategy`, ...)."""

    def __init__(self, size: int, policy: Policy | None = None, *, preset: str | None = None,
                 workspace: str | os.PathLike | None = None, max_pending: int = 1,
                 actor_options: dict | None = None) -> None:
        if size < 1 or max_pending < 1:
            raise StockadeError("usage", "a pool needs size >= 1 and max_pending >= 1")
        if policy is None and preset is None:
            preset = "workspace-write"
        root = os.path.realpath(os.fspath(workspace or os.getcwd()))
        options = {"max_restarts": -1, "max_task_retries": 0, "num_cpus": 0,
                   "scheduling_strategy": "SPREAD", **(actor_options or {})}
        remote = ray.remote(SandboxActor).options(**options)
        self.actors = [remote.remote(policy, preset, root) for _ in range(size)]
        self._pending = [0] * size
        self._max = max_pending
        self._free = threading.Condition()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, command: Sequence[str] | str, *, shell: bool = False,
               timeout: float | None = None, input: bytes | str | None = None) -> Task:
        """Run `command` (as Workspace.exec takes it) on the least busy actor."""
        actor = self._take()
        return Task(self.actors[actor].exec.remote(command, shell, timeout, input), actor,
                    self._release)

    def read_file(self, path: str) -> Task:
        actor = self._take()
        return Task(self.actors[actor].read_file.remote(path), actor, self._release)

    def write_file(self, path: str, data: bytes | str) -> Task:
        actor = self._take()
        return Task(self.actors[actor].write_file.remote(path, data), actor, self._release)

    def map(self, commands: Sequence[Sequence[str] | str], *, shell: bool = False,
            timeout: float | None = None) -> Iterator[Outcome | PoolError]:
        """Each command's Outcome (or its PoolError), in order, submitted as actors free up."""
        tasks: list[Task] = []
        for command in commands:
            tasks.append(self.submit(command, shell=shell, timeout=timeout))
        for task in tasks:
            try:
                yield task.result()
            except PoolError as exc:
                yield exc

    def ready(self, timeout: float = 120) -> list[tuple[str, int]]:
        """Wait until every actor answers (after a node died: until Ray has restarted its
        actors elsewhere); each one's node and process. PoolError `timeout` if one does not
        within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        places = []
        for actor in self.actors:
            while True:
                try:
                    places.append(ray.get(actor.where.remote(),
                                          timeout=max(0.1, deadline - time.monotonic())))
                    break
                except ray.exceptions.ActorDiedError as exc:  # (for good: it says why)
                    raise PoolError("actor_failed", f"an actor died and will not be "
                                    f"restarted: {exc}") from None
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    if time.monotonic() >= deadline:
                        raise PoolError("timeout", f"an actor did not answer within "
                                        f"{timeout}s") from None
                    time.sleep(0.5)  # (restarting: it answers once Ray has placed it)
        return places

    def close(self) -> None:
        """Close every actor's sandboxes, then end the actors."""
        closing = [actor.close.remote() for actor in self.actors]
        try:
            ray.get(closing, timeout=30)
        except ray.exceptions.RayError:
            pass  # (a dead actor's sandbox died with it)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def _take(self) -> int:
        with self._free:
            while min(self._pending) >= self._max:
                self._free.wait()
            actor = self._pending.index(min(self._pending))
            self._pending[actor] += 1
            return actor

    def _release(self, actor: int) -> None:
        with self._free:
            self._pending[actor] -= 1
            self._free.notify()
