"""A LangChain deepagents sandbox backend that runs in Stockade (`pip install
'stockade[deepagents]'`):

    sandbox = StockadeSandbox(Workspace(preset="workspace-write", workspace=path))
    agent = create_deep_agent(model=..., backend=sandbox.backend())

What deepagents gets: `execute` runs each shell command in one warm Stockade sandbox over the
workspace, with `python` on PATH (python3, as partner sandboxes' images have it; exit codes
in the shell's conventions: not found 127, timed out 124; output within `limits.output`,
`truncated` when cut; what the sandbox stopped or cut said in words at the end of the
output, with the policy grant that would allow it). `backend()` is the sandbox
with deepagents' artifacts root (where it offloads large tool results and summarized history,
`/large_tool_results` and `/conversation_history` by default: read-only in a sandbox, whose
root is) in the workspace, `ARTIFACTS`. `upload_files` and `download_files` are the
Workspace's file operations, performed inside the sandbox and never following a link; the
rest of the file tools (`ls`, `read`, `write`, `edit`, `grep`, `glob`) are deepagents' own
`BaseSandbox` scripts, run through `execute`, so inside the same sandbox.

What it cannot ask for: a path outside the workspace (deepagents paths are absolute: they must
lie in the workspace, else `permission_denied`; a relative one is `invalid_path`; an upload
of a file directly in /tmp goes to the sandbox's own /tmp, where deepagents stages a large
edit), a write to a
protected name (`permission_denied`), a link followed by an upload or download
(`permission_denied`), or a timeout beyond the policy's `limits.timeout` (a longer or zero
`timeout` runs under the policy's)."""

from __future__ import annotations

import os

from deepagents.backends.composite import CompositeBackend
from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from stockade.integrations.workspace import FileError, Outcome, Workspace
from stockade.launch.denials import with_denials

# Where deepagents' artifacts go (large tool results, summarized history), in the workspace.
ARTIFACTS = ".deepagents-artifacts"
ALIASES = os.path.join(os.path.dirname(os.path.realpath(__file__)), "aliases")
# Stockade's FileError codes in deepagents' FileOperationError words.
_ERRORS = {"not_found": "file_not_found", "not_a_directory": "file_not_found",
           "is_a_directory": "is_directory", "permission_denied": "permission_denied",
           "outside_workspace": "permission_denied", "symlink_refused": "permission_denied",
           "not_a_regular_file": "permission_denied"}


class StockadeSandbox(BaseSandbox):
    """deepagents' sandbox protocol over a Stockade Workspace (closed with `close()`)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        # `python` first on PATH, as the images of deepagents' partner sandboxes have it (the
        # suite and models call it; a host may have only python3): a script in the package
        path = workspace.env.get("PATH", os.defpath)
        self._env = {"PATH": f"{ALIASES}:{path}"}

    @property
    def id(self) -> str:
        return f"stockade:{self.workspace.root}"

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return _response(self.workspace.exec(command, shell=True, timeout=timeout or None,
                                              env=self._env))

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """`execute`, awaited: cancelling the run (its task) kills the command's tree."""
        return _response(await self.workspace.aexec(command, shell=True,
                                                    timeout=timeout or None, env=self._env))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                self.workspace.write_file(self._absolute(path), content,
                                          confined=not _in_tmp(path))
                responses.append(FileUploadResponse(path=path))
            except FileError as exc:
                responses.append(FileUploadResponse(path=path, error=_error(exc)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                content = self.workspace.read_file(self._absolute(path))
                responses.append(FileDownloadResponse(path=path, content=content))
            except FileError as exc:
                responses.append(FileDownloadResponse(path=path, error=_error(exc)))
        return responses

    def backend(self, artifacts: str = ARTIFACTS) -> CompositeBackend:
        """The backend to give `create_deep_agent`: this sandbox, with deepagents' artifacts
        root `artifacts` in the workspace (relative to it), which the sandbox may write: its
        own setting, so no other path is made writable. Large tool results are offloaded to
        `<artifacts>/large_tool_results/<call id>` there, for the model to read back, and
        summarized history to `<artifacts>/conversation_history`."""
        return CompositeBackend(default=self, routes={},
                                artifacts_root=self.workspace.resolve(artifacts))

    def close(self) -> None:
        self.workspace.close()

    def _absolute(self, path: str) -> str:
        if not os.path.isabs(path):
            raise FileError("invalid_path", f"{path}: not an absolute path")
        return path


def _in_tmp(path: str) -> bool:
    """Whether `path` names a file directly in /tmp, where deepagents stages a large edit's
    strings for the command that applies it: an upload there lands in the sandbox's own /tmp
    (the host's only where the policy grants it), as the command's own writes do."""
    return os.path.dirname(os.path.normpath(path)) == "/tmp"


def _response(outcome: Outcome) -> ExecuteResponse:
    return ExecuteResponse(output=with_denials(outcome.output, outcome.denials),
                           exit_code=outcome.exit_code, truncated=outcome.truncated)


def _error(exc: FileError) -> str:
    return "invalid_path" if exc.code == "invalid_path" else _ERRORS.get(exc.code, exc.message)
