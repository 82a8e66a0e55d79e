"""The OpenAI Agents SDK in Stockade (`pip install 'stockade[openai-agents]'`): an executor for
its shell tool and an editor for its apply_patch tool, both over one Workspace.

    workspace = Workspace(preset="workspace-write", workspace=path)
    agent = Agent(name="coder", tools=[ShellTool(executor=StockadeShellExecutor(workspace)),
                                       ApplyPatchTool(editor=StockadeEditor(workspace))])

What the SDK gets: each command of a shell call runs with /bin/sh -c in the Workspace's warm
sandbox, in order, with its own outcome (`exit` with the shell's exit code: not found 127; or
`timeout`); a call's `timeout_ms` applies to each command, never beyond the policy's
`limits.timeout`; `max_output_length` trims what the model sees. What the sandbox stopped or
cut (its time limit, output past `limits.output`, a proxy refusal) is said in words on stderr,
with the grant that would allow it. apply_patch operations
read and write files through the Workspace's file operations: inside the sandbox, in the
workspace only, never following a link; a refused operation is a `failed` result the model
sees, not an exception.

For the SDK's sandbox interface (`agents.sandbox`, `SandboxAgent` with
`RunConfig(sandbox=SandboxRunConfig(client=...))`), `StockadeSandboxClient` makes sessions
like the SDK's own local client (a workspace directory on this host, the manifest applied to
it, the workspace persisted and hydrated as a tar), except that every command a session
runs, the SDK's own helper commands included, runs in a Stockade sandbox over the manifest's
root, under the client's policy, with the policy's closed environment (the host's is not
passed in; the manifest's variables are not either: put them in the policy's `env.set`), and
that reads and writes go through the Workspace's file operations. A command's own `timeout`
raises the SDK's ExecTimeoutError; the policy's time limit, output cut at `limits.output` and
the sandbox's other denials are said in words on its stderr (never a silent cut).

What it cannot ask for: a command outside the sandbox or the policy (no call changes roots,
network or limits), the SDK's hosted container environments (they run at OpenAI, not here),
paths outside the workspace, a PTY (`supports_pty()` is false: interactive sessions are
refused by the SDK), acting as another user (`user=` is refused, `PermissionError`), and
host paths mounted into the workspace (the local client's manifest rules: refused there)."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.apply_diff import apply_diff
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.sandbox.errors import (
    ExecTimeoutError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.sandboxes.unix_local import (
    UnixLocalSandboxClient,
    UnixLocalSandboxSession,
    UnixLocalSandboxSessionState,
)
from agents.sandbox.session import SandboxSession
from agents.sandbox.types import ExecResult
from agents.tool import ShellCallOutcome, ShellCommandOutput, ShellCommandRequest, ShellResult

from stockade.integrations.workspace import FileError, Outcome, Workspace
from stockade.launch.denials import with_denials
from stockade.policy import Policy, resolve_policy


class StockadeShellExecutor:
    """The shell tool's executor: `ShellTool(executor=StockadeShellExecutor(workspace))`."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def __call__(self, request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        timeout = action.timeout_ms / 1000 if action.timeout_ms else None
        outputs = []
        for command in action.commands:
            outcome = await self.workspace.aexec(command, shell=True, timeout=timeout)
            outputs.append(_output(command, outcome))
        return ShellResult(output=outputs, max_output_length=action.max_output_length)


class StockadeEditor:
    """The apply_patch tool's editor: `ApplyPatchTool(editor=StockadeEditor(workspace))`."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return await self._change(operation, lambda _: apply_diff("", operation.diff or "",
                                                                  mode="create"))

    async def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return await self._change(operation, lambda text: apply_diff(text, operation.diff or ""))

    async def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        def delete() -> str:
            self.workspace.remove_file(operation.path)
            return f"deleted {operation.path}"
        return await self._attempt(delete)

    async def _change(self, operation: ApplyPatchOperation,
                      edit: Callable[[str], str]) -> ApplyPatchResult:
        def change() -> str:
            before = "" if operation.type == "create_file" else \
                self.workspace.read_file(operation.path).decode()
            target = operation.move_to or operation.path
            self.workspace.write_file(target, edit(before))
            if operation.move_to and operation.move_to != operation.path:
                self.workspace.remove_file(operation.path)
            return f"{operation.type.replace('_', ' ')} {target}"
        return await self._attempt(change)

    @staticmethod
    async def _attempt(step: Callable[[], str]) -> ApplyPatchResult:
        """`step()` in a worker thread, as a completed result or the failure the model sees."""
        try:
            return ApplyPatchResult("completed", await asyncio.to_thread(step))
        except FileError as exc:
            grant = f" (the grant that would allow it: {exc.grant})" if exc.grant else ""
            return ApplyPatchResult("failed", f"{exc.code}: {exc.message}{grant}")
        except (ValueError, UnicodeDecodeError) as exc:  # a diff that does not apply
            return ApplyPatchResult("failed", f"the patch does not apply: {exc}")


def _output(command: str, outcome: Outcome) -> ShellCommandOutput:
    result = ShellCallOutcome("timeout") if outcome.timed_out else \
        ShellCallOutcome("exit", outcome.exit_code)
    return ShellCommandOutput(stdout=outcome.stdout,
                              stderr=with_denials(outcome.stderr, outcome.denials),
                              outcome=result, command=command)


class StockadeSandboxSession(UnixLocalSandboxSession):
    """A local sandbox session whose commands and file reads and writes run in Stockade."""

    policy: Policy

    def __init__(self, *, state: UnixLocalSandboxSessionState, policy: Policy) -> None:
        super().__init__(state=state)
        self.policy = policy
        self._workspace: Workspace | None = None

    @property
    def workspace(self) -> Workspace:
        if self._workspace is None:
            self._workspace = Workspace(self.policy, workspace=self.state.manifest.root)
        return self._workspace

    def supports_pty(self) -> bool:
        return False

    async def _exec_internal(self, *command: str | Path,
                             timeout: float | None = None) -> ExecResult:
        argv = [os.fspath(word) for word in command]
        outcome = await self.workspace.aexec(argv, timeout=timeout)
        if outcome.timed_out and self.workspace.own_timeout(timeout):
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        # (the policy's time limit, output cut at limits.output: said on stderr, never silent)
        return ExecResult(stdout=outcome.stdout.encode(),
                          stderr=with_denials(outcome.stderr, outcome.denials).encode(),
                          exit_code=outcome.exit_code)

    async def read(self, path: Path, *, user: Any = None) -> io.IOBase:
        _no_user(user)
        target = self.normalize_path(path)
        try:
            return io.BytesIO(await asyncio.to_thread(self.workspace.read_file, target))
        except FileError as exc:
            if exc.code == "not_found":
                raise WorkspaceReadNotFoundError(path=path) from None
            raise WorkspaceArchiveReadError(path=path, context={"reason": exc.code}) from None

    async def write(self, path: Path, data: io.IOBase, *, user: Any = None) -> None:
        _no_user(user)
        target = self.normalize_path(path, for_write=True)
        payload = data.read()
        content = payload.encode() if isinstance(payload, str) else bytes(payload)
        try:
            await asyncio.to_thread(self.workspace.write_file, target, content)
        except FileError as exc:
            raise WorkspaceArchiveWriteError(path=target, context={"reason": exc.code,
                                                                   "grant": exc.grant}) from None

    async def _after_shutdown(self) -> None:
        await super()._after_shutdown()
        if self._workspace is not None:
            await asyncio.to_thread(self._workspace.close)


class StockadeSandboxClient(UnixLocalSandboxClient):
    """The SDK's sandbox client for Stockade: `policy` (a Policy or a policy file) or `preset`
    (default "workspace-write") is every session's sandbox."""

    backend_id = "stockade"

    def __init__(self, policy: Policy | str | os.PathLike | None = None, *,
                 preset: str | None = None, **options: Any) -> None:
        super().__init__(inherit_host_environment=False, **options)
        if policy is None and preset is None:
            preset = "workspace-write"
        self.policy = resolve_policy(policy, preset)

    async def create(self, **arguments: Any) -> SandboxSession:
        return self._confined(await super().create(**arguments))

    async def resume(self, state: Any) -> SandboxSession:
        return self._confined(await super().resume(state))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if isinstance(inner, StockadeSandboxSession) and inner._workspace is not None:
            await asyncio.to_thread(inner._workspace.close)
        return await super().delete(session)

    def _confined(self, session: SandboxSession) -> SandboxSession:
        local = session._inner
        inner = StockadeSandboxSession(state=local.state, policy=self.policy)
        inner._host_environment_allowlist = local._host_environment_allowlist
        return self._wrap_session(inner, instrumentation=self._instrumentation)


def _no_user(user: Any) -> None:
    if user is not None:
        raise PermissionError("a Stockade sandbox runs as its caller: no other user")
