"""pydantic-ai in Stockade (`pip install 'stockade[pydantic-ai]'`): a workspace backend, and
a capability that attaches it to an agent as pydantic-ai's own `LocalWorkspace` does.

    agent = Agent(model, capabilities=[StockadeWorkspace(path, preset="workspace-write")])

    @agent.tool
    async def execute(ctx: RunContext[None], command: str) -> str:
        return (await ctx.workspace.run(command, shell=True)).stdout

What pydantic-ai gets: `StockadeWorkspaceBackend` implements its `WorkspaceBackend` and
`SupportsCommands` protocols (and `SupportsRealpath`, resolved inside the sandbox). Every
command runs in one warm Stockade sandbox over the working
directory, with the shell's exit codes (a missing program exits 127), output decoded with
U+FFFD for undecodable bytes, `WorkspaceTimeoutError` past `timeout`, and
`WorkspaceOutputLimitError` when the output passes the policy's `limits.output` (never a
silently truncated success); their messages, and a result's stderr, say in words what the
sandbox stopped or cut, with the policy grant that would allow it. It does not implement
`SupportsFilesystem`: pydantic-ai then performs its file operations through the backend's
shell, so they run inside the same sandbox and reach only what the policy grants. The
backend passes pydantic-ai's own conformance suite (`pydantic_ai.workspaces.conformance`).

What it cannot ask for: a command outside the sandbox, or beyond the policy: a `timeout` never
lengthens `limits.timeout` (the shorter one applies), and `env` adds variables to the policy's
closed environment only where the policy allows them (a refused name is a `WorkspaceError`).
A ref names this working directory only: one from message history that names another
directory is declined, so history cannot move the agent elsewhere on the host."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic_ai.capabilities.abstract import AbstractCapability
from pydantic_ai.messages import WorkspaceRef
from pydantic_ai.workspaces import (
    CommandResult,
    WorkspaceError,
    WorkspaceOutputLimitError,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)

from stockade.errors import StockadeError
from stockade.integrations.workspace import Workspace, denial_lines, with_denials
from stockade.policy import Policy, resolve_policy

PROVIDER = "stockade"
WATCH_INTERVAL = 0.25  # seconds between checks that the workspace directory still exists


class StockadeWorkspaceBackend:
    """pydantic-ai's workspace backend in a Stockade sandbox over `root` under `policy`
    (commands, and `realpath` resolved inside the sandbox). The sandbox starts on the first
    operation; `close()` ends it."""

    def __init__(self, root: str | os.PathLike, policy: Policy) -> None:
        self.root = os.path.realpath(root)
        self.policy = policy
        self._workspace: Workspace | None = None
        self._opening = threading.Lock()

    @property
    def ref(self) -> WorkspaceRef:
        return WorkspaceRef(provider=PROVIDER, id=self.root)

    @property
    def workspace(self) -> Workspace:
        with self._opening:
            if self._workspace is None:
                self._workspace = Workspace(self.policy, workspace=self.root)
            return self._workspace

    def close(self) -> None:
        with self._opening:
            if self._workspace is not None:
                self._workspace.close()

    async def working_dir(self) -> str:
        if not await anyio.to_thread.run_sync(os.path.isdir, self.root):
            raise WorkspaceUnavailableError(f"the workspace {self.root} is gone")
        return self.root

    async def run(self, command: str | Sequence[str], *, shell: bool = False,
                  env: Mapping[str, str] | None = None,
                  timeout: float | None = None) -> CommandResult:
        if shell != isinstance(command, str):
            raise TypeError("a string command needs shell=True, an argv shell=False")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise ValueError(f"timeout must be a positive finite number, not {timeout!r}")
        await self.working_dir()
        cancel = threading.Event()  # kills the command's tree: on cancellation, or once the
        # workspace directory is gone (the sandbox's view keeps it, so the command cannot tell)
        gone = False

        async def watch() -> None:
            nonlocal gone
            while not gone:
                await anyio.sleep(WATCH_INTERVAL)
                gone = not await anyio.to_thread.run_sync(os.path.isdir, self.root)
            cancel.set()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch)
                outcome = await self.workspace.aexec(command, shell=shell, env=env,
                                                     timeout=timeout, cancel=cancel)
                group.cancel_scope.cancel()
        except StockadeError as exc:
            raise WorkspaceError(str(exc)) from None
        if gone:
            raise WorkspaceUnavailableError(f"the workspace {self.root} was removed while the "
                                            "command ran")
        said = " ".join(denial_lines(outcome.denials))  # (what stopped or cut it, in words)
        if outcome.timed_out:
            raise WorkspaceTimeoutError(said, stdout=outcome.stdout, stderr=outcome.stderr)
        if outcome.truncated:
            raise WorkspaceOutputLimitError(said, limit=self.workspace.limits.output or 0,
                                            stdout=outcome.stdout, stderr=outcome.stderr)
        return CommandResult(exit_code=outcome.exit_code, stdout=outcome.stdout,
                             stderr=with_denials(outcome.stderr, outcome.denials))

    async def realpath(self, path: str) -> str:
        """`path` resolved inside the sandbox, as it sees the workspace (`readlink -m`)."""
        done = await self.run(["readlink", "-m", "--", path])
        if done.exit_code != 0:
            raise OSError(f"{path}: cannot be resolved ({done.stderr.strip()})")
        return done.stdout.rstrip("\n")


@dataclass
class StockadeWorkspace(AbstractCapability[Any]):
    """Gives runs a workspace in a Stockade sandbox over `working_dir`, under `policy` (a
    Policy or a policy file) or `preset` (default "workspace-write"). One warm sandbox serves
    every run of the agent; `close()` ends it."""

    working_dir: str | Path
    _: KW_ONLY
    policy: Policy | str | None = None
    preset: str | None = None
    id: str | None = "stockade_workspace"

    def __post_init__(self) -> None:
        if self.policy is None and self.preset is None:
            self.preset = "workspace-write"
        self._backend = StockadeWorkspaceBackend(os.path.expanduser(self.working_dir),
                                                 resolve_policy(self.policy, self.preset))

    def get_workspace(self, ctx: Any, *,
                      ref: WorkspaceRef | None) -> StockadeWorkspaceBackend | None:
        # a ref from history never moves the agent to another directory
        return None if ref is not None and ref != self._backend.ref else self._backend

    def close(self) -> None:
        self._backend.close()
