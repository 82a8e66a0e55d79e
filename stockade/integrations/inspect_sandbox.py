"""An Inspect AI sandbox environment in Stockade (`pip install 'stockade[inspect]'`): import
this module and give a task `sandbox=("stockade", CONFIG)`, CONFIG being a preset name or a
policy file (default: "workspace-write").

What Inspect gets: each sample runs in a fresh temporary directory (its working directory,
removed with everything in it at the sample's cleanup) with a warm Stockade sandbox over it.
`exec` runs there with the shell's exit codes; a missing program is a failed result (127), a
file that cannot be executed raises `PermissionError`, `timeout` raises `TimeoutError` (it
never lengthens the policy's `limits.timeout`: a command the policy's limit stops is a failed
result, 124), and output past `limits.output` raises `OutputLimitExceededError`. What the
sandbox stopped or cut is said in words, with the policy grant that would allow it, on stderr
(on the error's message and partial output when it raises), so it reaches the model. Inspect's
sandbox tools (`text_editor()`), which it installs under /var/tmp, are installed in the
sample's directory (a hidden directory of its own) instead: the sandbox cannot write /var/tmp,
and the sample's directory is already its to write.

`read_file` and `write_file` run inside the sandbox and never follow a symbolic link: relative
paths are in the sample's directory, absolute ones reach what the sandbox can (a read root is
read-only, the sandbox's own `/tmp` is its own); `FileNotFoundError`, `IsADirectoryError`,
`PermissionError`, `UnicodeDecodeError` and `OutputLimitExceededError` (past Inspect's own
read bound, 100 MiB unless overridden) as Inspect's contract asks.

What it cannot ask for: another user (`SandboxUserUnsupportedError`: a sandbox runs as its
caller, the one `user` it accepts), a connection or a service (no `connection()`), a network
beyond the policy, or any path the policy does not grant. Escape benchmarks can run their
tasks in it: what they find is what the policy and `stockade report` say."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from typing import Any, Literal, overload

import anyio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR

from stockade.integrations.workspace import NOT_EXECUTABLE, FileError, Workspace
from stockade.launch.denials import denial_lines, with_denials
from stockade.policy import PRESETS, Policy, load_policy, preset

DEFAULT_PRESET = "workspace-write"
# Where Inspect installs its sandbox tools (text_editor's): /var/tmp/<name> in every sandbox.
# In a Stockade sandbox, <name> is in the sample's directory instead (the sandbox has no /var).
TOOLS_PARENT, TOOLS_NAME = os.path.split(SANDBOX_TOOLS_DIR)
_FILE_ERRORS: dict[str, type[OSError]] = {
    "not_found": FileNotFoundError, "not_a_directory": NotADirectoryError,
    "is_a_directory": IsADirectoryError, "permission_denied": PermissionError,
    "outside_workspace": PermissionError, "symlink_refused": PermissionError,
    "not_a_regular_file": PermissionError}


@sandboxenv(name="stockade")
class StockadeSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: a Workspace over a fresh temporary directory."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.directory = os.path.realpath(tempfile.mkdtemp(prefix="stockade-inspect-"))
        self.workspace = Workspace(policy, workspace=self.directory)

    @classmethod
    async def sample_init(cls, task_name: str, config: Any,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        return {"default": cls(_policy(config))}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: Any,
                             environments: dict[str, SandboxEnvironment],
                             interrupted: bool) -> None:
        for environment in environments.values():
            if isinstance(environment, StockadeSandboxEnvironment):
                await anyio.to_thread.run_sync(environment.close)

    def close(self) -> None:
        """Kill everything in the sandbox and remove the sample's directory."""
        self.workspace.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def exec(self, cmd: list[str], input: str | bytes | None = None,
                   cwd: str | None = None, env: dict[str, str] | None = None,
                   user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        if user is not None and not _is_caller(user):
            raise SandboxUserUnsupportedError(f"a Stockade sandbox runs as its caller, not "
                                              f"as {user!r}")
        outcome = await self.workspace.aexec(self._tools_here(cmd), input=input, cwd=cwd,
                                             env=env, timeout=timeout)
        if outcome.timed_out and self.workspace.own_timeout(timeout):
            error = TimeoutError(f"{cmd[0]}: timed out after {timeout} s")
            # (the output so far, which Inspect gives the model, as its docker sandbox does)
            error.truncated_output = with_denials(outcome.output, outcome.denials)  # type: ignore[attr-defined]
            raise error
        if outcome.exit_code == NOT_EXECUTABLE and not outcome.stdout:
            raise PermissionError(outcome.stderr.strip())
        if outcome.truncated:
            said = " ".join(denial_lines(outcome.denials))
            raise OutputLimitExceededError(
                limit_str=f"{self.workspace.limits.output} bytes ({said})",
                truncated_output=with_denials(outcome.output, outcome.denials))
        return ExecResult(success=outcome.exit_code == 0, returncode=outcome.exit_code,
                          stdout=outcome.stdout,
                          stderr=with_denials(outcome.stderr, outcome.denials))

    def _tools_here(self, cmd: list[str]) -> list[str]:
        """`cmd` with Inspect's sandbox-tools directory (SANDBOX_TOOLS_DIR, below /var/tmp,
        which the sandbox cannot write: it has no /var) moved into the sample's directory,
        whole and as the parent and name Inspect's framework-directory check takes apart."""
        tools = os.path.join(self.directory, TOOLS_NAME)
        moved = []
        for at, word in enumerate(cmd):
            if word == TOOLS_PARENT and cmd[at + 1:at + 2] == [TOOLS_NAME]:
                word = self.directory
            elif word == SANDBOX_TOOLS_DIR or word.startswith(SANDBOX_TOOLS_DIR + "/"):
                word = tools + word[len(SANDBOX_TOOLS_DIR):]
            moved.append(word)
        return moved

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        await self._file(lambda: self.workspace.write_file(file, data, confined=False), file)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        # Inspect's own bound on a read (100 MiB unless overridden), not limits.output: what
        # the harness reads is its own, not a command's output
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        data = await self._file(lambda: self.workspace.read_file(
            file, confined=False, limit=limit), file,
            limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR)
        # (newlines as they are: Inspect asks for `newline=""` semantics)
        return data.decode("utf-8") if text else data

    async def _file(self, operation: Any, file: str, limit_str: str | None = None) -> Any:
        try:
            return await anyio.to_thread.run_sync(operation)
        except FileError as exc:
            if exc.code == "too_large" and limit_str is not None:
                raise OutputLimitExceededError(limit_str=limit_str,
                                               truncated_output=None) from None
            raise _FILE_ERRORS.get(exc.code, OSError)(f"{file}: {exc.message}") from None


def _is_caller(user: str) -> bool:
    """Whether `user` (a name or uid) is this process's effective user, the one a sandbox
    runs as (so Inspect's local sandbox accepts it too)."""
    try:
        uid = int(user) if user.isdecimal() else pwd.getpwnam(user).pw_uid
    except KeyError:
        return False
    return uid == os.geteuid()


def _policy(config: Any) -> Policy:
    """The policy a task's sandbox CONFIG names: a preset, or a policy file."""
    if config is None:
        return preset(DEFAULT_PRESET)
    # (Inspect makes a string config a path beside the task file: a preset name comes back
    # as one whose file does not exist)
    if isinstance(config, str) and not os.path.exists(config) and \
            os.path.basename(config) in PRESETS:
        return preset(os.path.basename(config))
    return load_policy(config)
