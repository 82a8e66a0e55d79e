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
shell, so they run inside the same sandbox and reach only what the policy grants. As with
pydantic-ai's local backend, a process a command detaches (`setsid`, a daemon) runs on after
the command, inside its sandbox, until the backend closes (Stockade's `keep_detached`; a
timeout or cancellation still kills everything the command started). The backend passes
pydantic-ai's own conformance suite (`pydantic_ai.workspaces.conformance`).

What it cannot ask for: a command outside the sandbox, or beyond the policy: a `timeout` never
lengthens `limits.timeout` (the shorter one applies), and `env` adds variables to the policy's
closed environment only where the policy allows them (a refused name is a `WorkspaceError`).
A ref names this working directory only: one from message history that names another
directory is declined, so history cannot move the agent elsewhere on the host. The capability's
options (`read_only`, `env`, `authority`, `path_authority`, as `LocalWorkspace` has them) only
narrow the policy: see `StockadeWorkspace`."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic_ai.capabilities.abstract import AbstractCapability
from pydantic_ai.messages import Authority, WorkspaceRef
from pydantic_ai.workspaces import (
    AuthorityWorkspace,
    CommandResult,
    ReadOnlyWorkspace,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceOutputLimitError,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces import Workspace as PydanticWorkspace

from stockade.errors import PolicyError, StockadeError
from stockade.integrations.workspace import Workspace, read_only_policy
from stockade.launch.denials import denial_lines, with_denials
from stockade.launch.env import close_environment
from stockade.launch.hostpaths import inside
from stockade.policy import Policy, merge, resolve_policy

PROVIDER = "stockade"
WATCH_INTERVAL = 0.25  # seconds between checks that the workspace directory still exists


class StockadeWorkspaceBackend:
    """pydantic-ai's workspace backend in a Stockade sandbox over `root` under `policy`
    (commands, and `realpath` resolved inside the sandbox). The sandbox starts on the first
    operation; `close()` ends it, and what its commands detached (`keep_detached`: on, as
    pydantic-ai's local backend keeps them; off, nothing outlives its command)."""

    def __init__(self, root: str | os.PathLike, policy: Policy, *,
                 keep_detached: bool = True) -> None:
        self.root = os.path.realpath(root)
        self.policy = policy
        self.keep_detached = keep_detached
        self._workspace: Workspace | None = None
        self._opening = threading.Lock()

    @property
    def ref(self) -> WorkspaceRef:
        return WorkspaceRef(provider=PROVIDER, id=self.root)

    @property
    def workspace(self) -> Workspace:
        with self._opening:
            if self._workspace is None:
                self._workspace = Workspace(self.policy, workspace=self.root,
                                            keep_detached=self.keep_detached)
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
    every run of the agent; `close()` ends it.

    The options of pydantic-ai's own `LocalWorkspace`, mapped onto the policy, which they can
    only narrow: `read_only` (the workspace refuses commands and file changes, as pydantic-ai's
    `ReadOnlyWorkspace` does, and the sandbox under it has no write root and no home of its
    own: its reads write nothing on the host either); `env` (variables for every command,
    added to the policy's closed environment as its `env.set` is: a refused name is a
    PolicyError here); `authority` and `path_authority` (as pydantic-ai's
    `AuthorityWorkspace`: how file text reaches the model), each path confined to the working
    directory (one outside is PolicyError `outside_workspace`: a Stockade workspace is its
    directory, and the sandbox reaches a file elsewhere only where the policy grants it).
    `keep_detached` (default on, as `LocalWorkspace` keeps background processes): what a
    command detaches runs on in the sandbox until `close()`; off, nothing outlives its
    command."""

    working_dir: str | Path
    _: KW_ONLY
    policy: Policy | str | None = None
    preset: str | None = None
    read_only: bool = False
    authority: Authority = "operator"
    path_authority: Mapping[str, Authority] | None = None
    env: Mapping[str, str] | None = None
    keep_detached: bool = True
    id: str | None = "stockade_workspace"

    def __post_init__(self) -> None:
        if self.policy is None and self.preset is None:
            self.preset = "workspace-write"
        root = os.path.realpath(os.path.expanduser(self.working_dir))
        policy = resolve_policy(self.policy, self.preset)
        if self.env:  # (a refused name is refused here, where it is written)
            close_environment((), tuple(self.env.items()), {})
            policy = merge(policy, {"env": {"set": dict(self.env)}}, file="StockadeWorkspace")
        if self.read_only:
            policy = read_only_policy(policy)
        if self.path_authority:
            self.path_authority = _confined(root, self.path_authority)
        self._backend = StockadeWorkspaceBackend(root, policy, keep_detached=self.keep_detached)

    def get_workspace(self, ctx: Any, *, ref: WorkspaceRef | None) -> WorkspaceBackend | None:
        # a ref from history never moves the agent to another directory
        if ref is not None and ref != self._backend.ref:
            return None
        workspace: WorkspaceBackend = self._backend
        if self.read_only:
            workspace = ReadOnlyWorkspace(PydanticWorkspace(workspace))
        if self.authority != "operator" or self.path_authority:
            workspace = AuthorityWorkspace(PydanticWorkspace(workspace),
                                           authority=self.authority,
                                           path_authority=self.path_authority)
        return workspace

    def close(self) -> None:
        self._backend.close()


_RANK: tuple[Authority, ...] = ("none", "user", "operator")


def _confined(root: str, levels: Mapping[str, Authority]) -> dict[str, Authority]:
    """`levels` with each path absolute (`~` expanded, a relative one in `root`), the lowest
    level kept for a path named twice; PolicyError for a path outside `root`."""
    confined: dict[str, Authority] = {}
    for path, level in levels.items():
        absolute = os.path.normpath(os.path.join(root, os.path.expanduser(path)))
        if not inside(absolute, root):
            raise PolicyError(f"{path}: outside the workspace {root} (a file elsewhere reaches "
                              "the sandbox only where filesystem.read grants it)",
                              key="path_authority", code="outside_workspace")
        confined[absolute] = min(level, confined.get(absolute, level), key=_RANK.index)
    return confined
