"""Compile a Policy into a LaunchRequest: placeholders expanded, paths resolved once.

Each root is resolved a single time, here: the canonical target (every symlink and `..`
resolved) is what backends enforce, the lexical alias is kept so the sandbox can offer the same
name. Nothing later re-resolves a path by its name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stockade.errors import PolicyError, UsageError
from stockade.launch.env import close_environment
from stockade.launch.request import LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.net.env import SANDBOX_PORT, proxy_environment
from stockade.policy.model import Policy

PLACEHOLDERS = ("workspace", "tmp", "home")


@dataclass(frozen=True)
class CompileContext:
    """Where placeholders point. Defaults: the current directory, the temp dir, the home dir."""

    workspace: str
    home: str
    tmp: str | None  # None: the host's temp dir, looked up only by a path that uses `{tmp}`
    host_env: Mapping[str, str]

    @classmethod
    def current(cls, workspace: str | os.PathLike | None = None) -> CompileContext:
        return cls(
            workspace=os.path.abspath(os.fspath(workspace) if workspace else os.getcwd()),
            home=os.path.expanduser("~"),
            tmp=None,
            host_env=dict(os.environ),
        )


def compile_policy(
    policy: Policy,
    argv: list[str] | tuple[str, ...],
    ctx: CompileContext | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    stdin: str | None = None,
) -> LaunchRequest:
    """Resolve `policy` for running `argv`; raises PolicyError for anything unresolvable."""
    ctx = ctx or CompileContext.current()
    check_argv(argv)
    fs = policy.filesystem
    read = _grants(fs.read, "filesystem.read", ctx, must_exist=True)
    write = _grants(fs.write, "filesystem.write", ctx, must_exist=True)
    deny = _grants(fs.deny, "filesystem.deny", ctx, must_exist=False)
    _check_overlaps(read, write, deny)
    workdir = _resolve_cwd(cwd, policy, ctx, read + write)
    return LaunchRequest(
        argv=tuple(argv),
        cwd=workdir,
        env=_with_proxy(policy, close_environment(policy.env.passthrough,
                                                  _expand_env(policy, ctx), ctx.host_env)),
        read=read,
        write=write,
        deny=deny,
        protected=tuple(sorted(set(fs.protected))),
        exec_from_write=fs.exec_from_write,
        network=NetworkSpec(
            mode=policy.network.mode,
            allow=tuple(sorted(set(policy.network.allow))),
            deny=tuple(sorted(set(policy.network.deny))),
        ),
        limits=LimitSpec(**vars(policy.limits)),
        stdin=stdin or policy.process.stdin,
    )


def check_argv(argv: Sequence[str]) -> None:
    """UsageError unless `argv` is a non-empty list of non-empty strings without NUL."""
    if not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv):
        raise UsageError("argv must be a non-empty list of non-empty strings without NUL")


def expand(path: str, ctx: CompileContext) -> str:
    """Expand a leading placeholder or `~`; relative paths are relative to the workspace."""
    for name in PLACEHOLDERS:
        token = "{" + name + "}"
        if path == token or path.startswith(token + "/"):
            path = _placeholder(ctx, name) + path[len(token):]
            break
    if path == "~" or path.startswith("~/"):
        path = ctx.home + path[1:]
    if not os.path.isabs(path):
        path = os.path.join(ctx.workspace, path)
    return os.path.normpath(path)


def _placeholder(ctx: CompileContext, name: str) -> str:
    value = getattr(ctx, name)
    if value is None:  # (tmp: importing tempfile is ≈ 5 ms of every CLI run, rarely needed)
        import tempfile

        value = tempfile.gettempdir()
    return value


def canonical_path(path: str) -> str:
    """os.path.realpath(path, strict=True) (OSError if it does not exist). On Linux, in three
    system calls, by what /proc/self/fd says a descriptor opened: realpath itself lstats every
    component of every path, at every launch."""
    if sys.platform != "linux":
        return os.path.realpath(path, strict=True)
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc
        return os.path.realpath(path, strict=True)
    finally:
        os.close(fd)


def _grants(paths: tuple[str, ...], key: str, ctx: CompileContext,
            *, must_exist: bool) -> tuple[PathGrant, ...]:
    grants: dict[str, PathGrant] = {}
    for raw in paths:
        optional = raw.startswith("?")
        alias = expand(raw[1:] if optional else raw, ctx)
        try:
            canonical = canonical_path(alias)
        except OSError:
            if must_exist and not optional:
                raise PolicyError(f"path {alias} does not exist", key=key) from None
            continue
        grants.setdefault(canonical, PathGrant(path=canonical, alias=alias))
    return tuple(sorted(grants.values(), key=lambda g: g.path))


if sys.platform == "win32":  # paths separated by "\", compared without regard to case
    from stockade.windows.admission import inside as _inside
else:
    def _inside(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")


def _check_overlaps(read: tuple[PathGrant, ...], write: tuple[PathGrant, ...],
                    deny: tuple[PathGrant, ...]) -> None:
    for hidden in deny:
        for kind, roots in (("read", read), ("write", write)):
            for root in roots:
                if _inside(root.path, hidden.path):
                    raise PolicyError(
                        f"{kind} root {root.path} lies inside denied path {hidden.path}",
                        key="filesystem.deny",
                    )


def _resolve_cwd(cwd: str | os.PathLike | None, policy: Policy, ctx: CompileContext,
                 roots: tuple[PathGrant, ...]) -> str:
    raw = os.fspath(cwd) if cwd is not None else policy.process.cwd or "{workspace}"
    try:
        resolved = canonical_path(expand(raw, ctx))
    except OSError:
        raise PolicyError(f"working directory {raw} does not exist", key="process.cwd") from None
    if not any(_inside(resolved, root.path) for root in roots):
        raise PolicyError(f"working directory {resolved} is not inside any read or write root",
                          key="process.cwd")
    return resolved


def _with_proxy(policy: Policy,
                env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """In allowlist mode, the proxy variables (they win over anything the policy set)."""
    if policy.network.mode != "allowlist":
        return env
    return tuple(sorted((dict(env) | proxy_environment(SANDBOX_PORT)).items()))


def _expand_env(policy: Policy, ctx: CompileContext) -> tuple[tuple[str, str], ...]:
    out = []
    for name, value in policy.env.set:
        if any(value == "{" + p + "}" or value.startswith("{" + p + "}/") for p in PLACEHOLDERS):
            value = expand(value, ctx)
        out.append((name, value))
    return tuple(out)
