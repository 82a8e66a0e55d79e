"""The OpenAI Agents SDK in Stockade (`pip install 'stockade[openai-agents]'`): an executor for
its shell tool and an editor for its apply_patch tool, both over one Workspace.

    workspace = Workspace(preset="workspace-write", workspace=path)
    agent = Agent(name="coder", tools=[ShellTool(executor=StockadeShellExecutor(workspace)),
                                       ApplyPatchTool(editor=StockadeEditor(workspace))])

What the SDK gets: each command of a shell call runs with /bin/sh -c in the Workspace's warm
sandbox, in order, with its own outcome (`exit` with the shell's exit code: not found 127; or
`timeout`); a call's `timeout_ms` applies to each command, never beyond the policy's
`limits.timeout`; `max_output_length` trims what the model sees. Denials (a timeout, a proxy
refusal) are appended to stderr with the grant that would allow them. apply_patch operations
read and write files through the Workspace's file operations: inside the sandbox, in the
workspace only, never following a link; a refused operation is a `failed` result the model
sees, not an exception.

What it cannot ask for: a command outside the sandbox or the policy (no call changes roots,
network or limits), the SDK's hosted container environments (they run at OpenAI, not here),
and paths outside the workspace. The SDK's own sandbox clients (`agents.sandbox`: manifests,
mounts, snapshots, PTY sessions) are a separate interface this module does not implement."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents.apply_diff import apply_diff
from agents.editor import ApplyPatchOperation, ApplyPatchResult
from agents.tool import ShellCallOutcome, ShellCommandOutput, ShellCommandRequest, ShellResult

from stockade.integrations.workspace import FileError, Outcome, Workspace


class StockadeShellExecutor:
    """The shell tool's executor: `ShellTool(executor=StockadeShellExecutor(workspace))`."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def __call__(self, request: ShellCommandRequest) -> ShellResult:
        action = request.data.action
        timeout = action.timeout_ms / 1000 if action.timeout_ms else None
        outputs = []
        for command in action.commands:
            outcome = await asyncio.to_thread(self.workspace.exec, command, shell=True,
                                              timeout=timeout)
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
    stderr = outcome.stderr + "".join(
        f"stockade: denied {d.kind} ({d.detail})"
        + (f"; the grant that would allow it: {d.grant}" if d.grant else "") + "\n"
        for d in outcome.denials)
    result = ShellCallOutcome("timeout") if outcome.timed_out else \
        ShellCallOutcome("exit", outcome.exit_code)
    return ShellCommandOutput(stdout=outcome.stdout, stderr=stderr, outcome=result,
                              command=command)
