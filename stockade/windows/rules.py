"""What the Windows backend refuses before anything happens (`Backend.check`), pure: every
refusal is a typed UnenforceableError naming the capability.

- `network.allowlist`, `network.any`: without the egress fence service (`fence()` says why it
  cannot be used; netfence.py), and `network.credentials`, `network.http` and `network.reach`,
  which the Windows fence does not offer;
- `limits.file_size`: Windows has no per-file size limit for a process tree;
- `limits.memory`, `limits.pids`, `limits.cpu` out of what a Job can hold (job.py);
- `filesystem.path`: a root, denied path or working directory that is not a canonical drive
  path (admission.py); `process.cwd` outside every root or longer than a current directory can
  be (`CWD_LIMIT`; longer roots and paths are reached through `\\\\?\\`: fsinfo.py);
  `filesystem.protected`: a protected name that is not a plain file name;
- `process.argv`: an argv no Windows command line can carry (cmdline.py); `env`: an environment
  Windows cannot hold (envblock.py).
"""

from __future__ import annotations

from collections.abc import Callable

from stockade.errors import UnenforceableError
from stockade.launch import hostcode
from stockade.launch.request import LaunchRequest
from stockade.windows import cmdline, envblock, netfence
from stockade.windows.admission import inside, lexical_refusal
from stockade.windows.job import job_plan

CWD_LIMIT = 258  # SetCurrentDirectoryW, CreateProcessW's lpCurrentDirectory: 260 with "\\" and NUL


def check(request: LaunchRequest, long_path: Callable[[str], str] | None = None,
          fence: Callable[[], str | None] | None = None) -> None:
    if request.limits.file_size is not None:
        raise UnenforceableError("limits.file_size",
                                 "Windows has no per-file size limit for a process tree")
    job_plan(request.limits, cpus=1)
    hostcode.refuse_unkept(request, "the Windows backend")
    for grant in request.read + request.write + request.deny:
        _admit(grant.path, long_path)
    _admit(request.cwd, long_path)
    if not any(inside(request.cwd, g.path) for g in request.read + request.write):
        raise UnenforceableError("process.cwd",
                                 f"{request.cwd} is not inside any read or write root")
    if len(request.cwd) > CWD_LIMIT:
        raise UnenforceableError(
            "process.cwd", f"{request.cwd[:64]}... is {len(request.cwd)} characters long; a "
            f"process's current directory holds at most {CWD_LIMIT} on Windows (MAX_PATH with "
            "a final backslash and the NUL, whatever LongPathsEnabled says for other paths): "
            "run from a shorter directory inside the root")
    for name in request.protected:
        if name in ("", ".", "..") or any(char in name for char in '\\/:'):
            raise UnenforceableError("filesystem.protected",
                                     f"protected name {name!r} is not a plain file name")
    try:
        cmdline.command_line(request.argv)
    except ValueError as exc:
        raise UnenforceableError("process.argv", str(exc)) from None
    try:
        envblock.environment_block(request.env)
    except ValueError as exc:
        raise UnenforceableError("env", str(exc)) from None
    netfence.check(request, fence)  # (last: it may ask the fence service over its pipe)


def _admit(path: str, long_path: Callable[[str], str] | None) -> None:
    why = lexical_refusal(path, long_path)
    if why:
        raise UnenforceableError("filesystem.path", f"{path}: {why}")

