"""The Python API: `run` and `arun`.

    >>> import stockade
    >>> r = stockade.run(["sh", "-c", "echo hi; cat /etc/shadow"], preset="read-only")
    >>> r.exit_code, r.stdout
    (1, b'hi\\n')
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import replace

from stockade.errors import UsageError
from stockade.launch.compile import CompileContext, compile_policy
from stockade.launch.manager import SandboxManager
from stockade.launch.result import Result
from stockade.policy import Policy, load_policy
from stockade.policy import preset as preset_policy

DEFAULT_PRESET = "read-only"


def resolve_policy(policy: Policy | str | os.PathLike | None, preset: str | None) -> Policy:
    """A Policy from a Policy object, a policy file path, or a preset name."""
    if policy is not None and preset is not None:
        raise UsageError("give either policy or preset, not both")
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return load_policy(policy)
    return preset_policy(preset or DEFAULT_PRESET)


def run(
    argv: Sequence[str],
    policy: Policy | str | os.PathLike | None = None,
    *,
    preset: str | None = None,
    workspace: str | os.PathLike | None = None,
    cwd: str | os.PathLike | None = None,
    input: bytes | None = None,
    timeout: float | None = None,
    backend: str | None = None,
    cancel: threading.Event | None = None,
) -> Result:
    """Run `argv` in a fresh sandbox and return its Result.

    `policy` is a Policy, or the path of a TOML/JSON policy file; otherwise `preset` names one
    (default "read-only"). `workspace` is what `{workspace}` means (default: the current
    directory). `timeout` (seconds) overrides `limits.timeout`; setting the `cancel` event
    kills the sandbox tree (the Result then has `cancelled=True`). A policy with
    `containment = "vm"` runs in a fresh VM guest (see docs/vm.md). Errors are StockadeError
    subclasses with a stable `.code`: PolicyError (bad policy), UnavailableError /
    UnenforceableError (cannot sandbox here: nothing ran), SetupError, StartError.

        >>> stockade.run(["python3", "-c", "print(1)"], preset="workspace-write").stdout
        b'1\\n'
    """
    chosen = resolve_policy(policy, preset)
    if chosen.containment == "vm":
        return _run_in_vm(chosen, argv, workspace=workspace, cwd=cwd, input=input,
                          timeout=timeout, backend=backend, cancel=cancel)
    request = compile_policy(chosen, list(argv), CompileContext.current(workspace), cwd=cwd)
    if timeout is not None:
        if timeout <= 0:
            raise UsageError("timeout must be positive")
        request = replace(request, limits=replace(request.limits, timeout=timeout))
    manager = SandboxManager(backend, "require" if backend else "auto")
    return manager.run(request, input=input, cancel=cancel)


def _run_in_vm(policy: Policy, argv: Sequence[str], *, workspace: str | os.PathLike | None,
               backend: str | None, **options: object) -> Result:
    """`containment = "vm"`: a fresh guest for this one command (it boots in seconds)."""
    if backend is not None:
        raise UsageError(f'backend {backend!r} is a native backend; the policy asks for '
                         'containment = "vm"')
    from stockade.vm.qemu import VmSandbox

    with VmSandbox(policy, workspace=workspace) as sandbox:
        return sandbox.run(argv, **options)  # type: ignore[arg-type]


async def arun(argv: Sequence[str], policy: Policy | str | os.PathLike | None = None,
               **kwargs: object) -> Result:
    """`run` for asyncio programs. Cancelling the awaiting task kills the sandbox tree."""
    import asyncio  # only asyncio programs pay for importing it

    cancel = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(run, argv, policy, cancel=cancel, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancel.set()
        await asyncio.wait([task])  # the tree is gone before the cancellation propagates
        raise
