"""Compile a Policy into a LaunchRequest: placeholders expanded, paths resolved once.

Each root is resolved a single time, here: the canonical target (every symlink and `..`
resolved) is what backends enforce, the lexical alias is kept so the sandbox can offer the same
name. Nothing later re-resolves a path by its name.
"""

from __future__ import annotations

import ntpath
import os
import re
import secrets
import shlex
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from stockade.errors import PolicyError, StockadeError, UnenforceableError, UsageError
from stockade.launch import homecode, hostcode
from stockade.launch.env import close_environment
from stockade.launch.hostpaths import holding_root, inside, meeting_root
from stockade.launch.overlays import (
    refuse_host_code_copies,
    refuse_layer_copies,
    refuse_overlays_of_denied,
)
from stockade.launch.request import (
    CredentialSpec,
    LaunchRequest,
    LimitSpec,
    NetworkSpec,
    PathGrant,
)
from stockade.lifecycle import aliases, statedir
from stockade.net.env import SANDBOX_PORT, proxy_environment, with_proxy
from stockade.policy.model import Policy
from stockade.policy.presets import is_deny_file
from stockade.policy.render import kind as value_kind

PLACEHOLDERS = ("workspace", "tmp", "home")


def _key_dir() -> str:
    return statedir.key_dir()


def _passwd_home() -> str:
    return statedir.passwd_home()


@dataclass(frozen=True)
class CompileContext:
    """Where placeholders point. Defaults: the current directory, the temp dir, the home dir."""

    workspace: str
    home: str
    tmp: str | None  # None: the host's temp dir, looked up only by a path that uses `{tmp}`
    host_env: Mapping[str, str]
    # The seal key's directory, beside which the private homes lie (statedir.key_dir, from the
    # password database, never from host_env; the evidence's scenes name one of their own).
    key_dir: str = field(default_factory=_key_dir)
    # The home the password database names, whatever HOME says: the denied paths of the home
    # are denied there too ("" for none; the evidence's scenes name one of their own).
    passwd_home: str = field(default_factory=_passwd_home)

    @classmethod
    def current(cls, workspace: str | os.PathLike | None = None) -> CompileContext:
        _check_path(workspace, "workspace")
        if workspace is not None and not os.path.isdir(workspace):
            raise UsageError(f"workspace {os.fspath(workspace) or '(empty)'}: not a directory")
        return cls(
            workspace=os.path.abspath(os.fspath(workspace) if workspace else _current()),
            home=os.path.expanduser("~"),
            tmp=None,
            host_env=dict(os.environ),
        )


def _check_path(path: object, name: str) -> None:
    """UsageError unless `path` is None, a str or an os.PathLike naming a str (an int would
    name a descriptor to os.path, bytes a path Stockade never holds)."""
    if path is None or isinstance(path, str):
        return
    if not isinstance(path, os.PathLike) or not isinstance(os.fspath(path), str):
        raise UsageError(f"{name} must be a path (str or os.PathLike), got "
                         f"{type(path).__name__}")


def _current() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory has been removed: change to one that exists, "
                         "or name the workspace (--workspace, workspace=)") from None


def compile_policy(
    policy: Policy,
    argv: list[str] | tuple[str, ...],
    ctx: CompileContext | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    stdin: str | None = None,
) -> LaunchRequest:
    """Resolve `policy` for running `argv`; raises PolicyError for anything unresolvable.
    `stdin` ("null" | "inherit") overrides the policy's `process.stdin`; with neither, null."""
    ctx = ctx or CompileContext.current()
    check_argv(argv)
    fs = policy.filesystem
    read, read_links = _grants(fs.read, "filesystem.read", ctx)
    write, write_links = _grants(fs.write, "filesystem.write", ctx)
    if any(grant.path == "/" for grant in write):  # (said before what follows from it)
        raise UnenforceableError("filesystem.write", 'filesystem.write includes "/": the '
                                 "whole host writable, which no sandbox holds (its command "
                                 "could rewrite what runs outside it); grant the directories "
                                 "the command writes, or, for a policy that restricts nothing "
                                 "at all, run with --unsandboxed")
    # (not with an overlaid workspace, where every write root is a layer to review: the home
    # would be one too, its caches in every change set)
    home, home_links = _private_home(ctx) if fs.home == "private" \
        and fs.workspace == "direct" else ((), [])
    write = tuple(sorted({g.path: g for g in home + write}.values(), key=lambda g: g.path))
    _refuse_planted_links(read_links, write_links + home_links, read, write)
    _refuse_unjudged_mounts(read, write)
    state, places = _stockade_state(ctx, read, write, home)
    # (Landlock does not govern chmod: the command may make its own directories searchable)
    deny = _denied(fs.deny, ctx, write, read, modes_held=policy.isolation != "landlock") + state
    refuse_overlays_of_denied(read, write, deny)
    refuse_layer_copies(_denied_places(fs.deny, ctx) + list(places), read + write, deny)
    host_code, host_code_kinds, host_unmade = _host_code(ctx, write, deny)
    home_code = homecode.keep(homecode.places(ctx.home, ctx.host_env), [g.path for g in write],
                              homecode.homes(ctx.home))
    # (the run's own private home lies inside a masked homes directory: granted back there)
    _check_overlaps(read, write, tuple(g for g in deny if g.path not in places))
    workdir = _resolve_cwd(cwd, policy, ctx, read + write)
    credentials = _credentials(policy, ctx, read + write, deny)
    env = _with_proxy(policy, _with_credentials(credentials, _with_home(home, policy,
        close_environment(policy.env.passthrough, _expand_env(policy, ctx), ctx.host_env))))
    return LaunchRequest(
        argv=tuple(argv),
        cwd=workdir,
        env=env,
        read=read,
        write=write,
        deny=tuple(sorted(set(deny), key=lambda g: g.path)),
        stockade_state=places,
        host_code=host_code,
        host_code_kinds=host_code_kinds,
        home_code=tuple(sorted(path for path in home_code.readonly
                               if not any(inside(path, code) for code in host_code))),
        unmade=tuple(sorted(home_code.watched | host_unmade)),
        protected=tuple(sorted(set(fs.protected))),
        git=fs.git,
        exec_from_write=fs.exec_from_write,
        workspace=fs.workspace,
        network=NetworkSpec(
            mode=policy.network.mode,
            allow=tuple(sorted(set(policy.network.allow))),
            deny=tuple(sorted(set(policy.network.deny))),
            reach=tuple(sorted(set(policy.network.reach))),
            unix_sockets=policy.network.unix_sockets,
            credentials=credentials,
            http=policy.network.http,
        ),
        limits=LimitSpec(**vars(policy.limits) | ({"pids": None} if pids_lifted(policy)
                                                   else {})),
        stdin=stdin or policy.process.stdin or "null",
        containment=policy.containment,
        isolation=policy.isolation,
    )


def pids_lifted(policy: Policy) -> bool:
    """Whether `policy`'s limits.pids is its preset's, which the landlock tier cannot hold as
    root (RLIMIT_NPROC does not bind uid 0; the tier has no pid namespace): lifted, so that
    a preset runs there, and said (`stockade run` warns; the result's not_enforced). A pids
    of the policy's own (any other value) is refused by the tier instead."""
    if policy.isolation != "landlock" or policy.preset is None or policy.limits.pids is None:
        return False
    if getattr(os, "geteuid", lambda: -1)() != 0:
        return False
    from stockade.policy import preset

    return policy.limits.pids == preset(policy.preset).limits.pids


def check_argv(argv: Sequence[str]) -> None:
    """UsageError unless `argv` is a non-empty list of strings without NUL whose first, the
    command, is not empty. Other arguments may be empty (`ssh-keygen -N ''`)."""
    if isinstance(argv, str | bytes):
        raise UsageError(f"argv must be a list of arguments such as {['sh', '-c', 'echo hi']}, "
                         f"not a string (a string is run by a shell only with shell=True)")
    if not argv:
        raise UsageError("argv is empty: it must name a command")
    for index, argument in enumerate(argv):
        if not isinstance(argument, str):
            raise UsageError(f"argv[{index}] must be a string, got {value_kind(argument)}")
        if "\0" in argument:
            raise UsageError(f"argv[{index}] contains a NUL byte, which no argument can hold")
        try:
            os.fsencode(argument)  # (a lone surrogate, which no byte string holds)
        except UnicodeEncodeError:
            raise UsageError(f"argv[{index}] is not text the system can encode (a lone "
                             "surrogate?)") from None
    if not argv[0]:
        raise UsageError("argv[0], the command, is an empty string")


def expand(path: str | os.PathLike[str], ctx: CompileContext) -> str:
    """Expand a leading placeholder or `~`; relative paths are relative to the workspace."""
    path = os.fspath(path)
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


def _grants(paths: tuple[str, ...], key: str,
            ctx: CompileContext) -> tuple[tuple[PathGrant, ...], list[tuple[str, str]]]:
    """The roots `paths` name, resolved (a missing optional root skipped), and the symbolic
    links met on the way to each: (the link, the root's alias)."""
    grants: dict[str, PathGrant] = {}
    links: list[tuple[str, str]] = []
    for raw in map(os.fspath, paths):  # (a Policy made in Python may hold os.PathLike)
        optional = raw.startswith("?")
        alias = expand(raw[1:] if optional else raw, ctx)
        try:
            canonical = canonical_path(alias)
        except OSError:
            if not optional:
                raise PolicyError(f"path {alias} does not exist", key=key) from None
            continue
        if canonical != alias:
            links += [(link, alias) for link in _links_to(alias, canonical, key)]
        grants.setdefault(canonical, PathGrant(path=canonical, alias=alias))
    return tuple(sorted(grants.values(), key=lambda g: g.path)), links


def _links_to(alias: str, canonical: str, key: str) -> list[str]:
    """Every symbolic link met resolving `alias`, by its own canonical location, one
    component at a time; PolicyError if the walk does not end at `canonical` (the tree
    changed meanwhile). The launch opens `canonical` refusing every link, so a link made
    later fails the launch."""
    pending = [part for part in alias.split("/") if part][::-1]
    current, links, hops = "/", [], 0
    while pending:
        part = pending.pop()
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        try:
            is_link = os.path.islink(step)
            target = os.readlink(step) if is_link else ""
        except OSError:
            is_link = False
        if not is_link:
            current = step
            continue
        hops += 1
        if hops > 40:
            break
        links.append(step)
        if target.startswith("/"):
            current = "/"
        pending += [p for p in target.split("/") if p and p != "."][::-1]
    if current != canonical or hops > 40:
        raise PolicyError(f"path {alias} changed while it was being resolved", key=key)
    return links


def _refuse_planted_links(read_links: list[tuple[str, str]], write_links: list[tuple[str, str]],
                          read: tuple[PathGrant, ...], write: tuple[PathGrant, ...]) -> None:
    """A grant is never redirected by a link a sandbox could have planted: no root is reached
    through a link inside a write root, and no write root through a link inside any root."""
    for links, roots, key in ((read_links, write, "filesystem.read"),
                              (write_links, read + write, "filesystem.write")):
        for link, alias in links:
            holder = holding_root(link, roots)
            if holder is not None:
                raise UnenforceableError(
                    "filesystem.symlink",
                    f"{key}: {alias} is reached through the symbolic link {link}, inside the "
                    f"root {holder}, where a sandbox could have planted it; grant the path it "
                    f"points to ({os.path.realpath(link)}) instead, or remove the link")


def _refuse_repointable(alias: str, canonical: str, write: tuple[PathGrant, ...],
                        ctx: CompileContext) -> None:
    """Refuse, typed, a denied path reached through a symbolic link in a write root: the
    command could point the link elsewhere, and the next launch would deny that instead, the
    secret in the clear (attack 15, D1). A hidden entry at the top of a home is the host's,
    kept read-only and pinned where the home is a write root (homecode.py), so not refused."""
    homes = _homes(ctx)
    for link in _links_to(alias, canonical, "filesystem.deny"):
        holder = holding_root(link, write)
        kept = os.path.dirname(link) in homes and os.path.basename(link).startswith(".")
        if holder is not None and not kept:
            raise UnenforceableError(
                "filesystem.symlink",
                f"filesystem.deny: {alias} is reached through the symbolic link {link}, inside "
                f"the write root {holder}, which the command could point elsewhere for a later "
                f"launch; deny the path it points to ({canonical}) instead, or replace the "
                "link with what it points to")


def _refuse_unjudged_mounts(read: tuple[PathGrant, ...], write: tuple[PathGrant, ...]) -> None:
    """Refuse, typed, a root that holds, or lies in, a mount nothing can judge: one whose point
    this user cannot look up (below a directory it may not search, a path longer than the
    kernel takes: what it shows cannot be compared with the denied and protected paths, and in
    the landlock tier the command may make its own directories searchable; attack 16), or one
    of what a name since removed named that still has other names (a bind of a hard link, or
    of a directory, whose name was then removed: the mount table says `//deleted`, not where it
    is now; attacks 11 and 13). A file with no name left (a resolv.conf a container's host
    replaced) is what it was, nothing of the host's now; a point not there is hidden."""
    mounts = aliases.table()
    for point in [*mounts.at, *mounts.unresolved]:
        key, holder = "filesystem.write", meeting_root(point, write)
        if holder is None:
            key, holder = "filesystem.read", meeting_root(point, read)
        if holder is None:
            continue
        info = aliases.look(point)
        if info is None:
            continue  # (hidden under another mount, or out of the command's reach too)
        top = point in mounts.at and mounts.at[point].top
        if top and top.endswith("//deleted") and (stat.S_ISDIR(info.st_mode)
                                                  or info.st_nlink > 0):
            raise UnenforceableError(key, (
                f"{point}, in or above the root {holder}, is a mount of what a name since "
                f"removed named ({top.removesuffix('//deleted')}), which may show a "
                "denied or protected file that no name of it tells of; unmount it "
                f"(umount {point}) or choose roots that do not hold it"))


def _denied_places(paths: tuple[str, ...], ctx: CompileContext) -> list[str]:
    """Where each denied path is, or would be: one an overlay hides (a whiteout) is still in
    its layers."""
    return [os.path.realpath(alias) for raw in paths
            for alias in _in_every_home(raw.removeprefix("?"), ctx)]


def _denied(paths: tuple[str, ...], ctx: CompileContext, write: tuple[PathGrant, ...],
            read: tuple[PathGrant, ...] = (), *, modes_held: bool = True
            ) -> tuple[PathGrant, ...]:
    """The denied paths that exist, each under every name it has: a path of the home in each
    of this user's homes ($HOME and the password database's: sudo -E, a CI runner or a tool
    may set HOME elsewhere, issue 29 dn4), and each other name a root shows it or a part of
    it by (a bind mount of it, of a directory above it, of a file in it: aliases.seen, dn5),
    each masked there. One that does not exist
    inside a write root, under any of its names, could be created by the command, and no
    mount can cover a name that is not there: refused, once, naming every such path and one
    command that makes them all. A root that lies inside a denied path under another name is
    refused as one inside it by its own is (_check_overlaps). One this user may not look up
    is refused in a write root, and, where the command can change the modes of this user's
    files in read roots too (not `modes_held`: the landlock tier), below a directory of its
    own in a read root (attack 11, dl9i-readroot: chmod u+x, then read)."""
    grants: dict[str, PathGrant] = {}
    missing: dict[str, tuple[str, str]] = {}
    unsearchable: set[str] = set()  # (aliases this user may not look up: not known missing)
    blocked: dict[str, str] = {}  # (such an alias: where it lies)
    mounts = aliases.table()
    for alias in dict.fromkeys(name for raw in map(os.fspath, paths)
                               for name in _in_every_home(raw.removeprefix("?"), ctx)):
        try:
            canonical = canonical_path(alias)
        except OSError as exc:
            if isinstance(exc, PermissionError):
                # (a link on the way counts as what it leads to: a root-owned /home -> var/home)
                above = os.path.realpath(aliases.first_unsearchable(alias))
                if not _own(above):
                    # (another user's: nor may the command search it, or change that; but a
                    # mount may show what lies below it in a root: each such name is denied,
                    # unverified, as nothing there can be looked up to compare; attack 12)
                    grants.update({name: PathGrant(path=name, alias=name) for name in
                                   aliases.shown(os.path.realpath(alias),
                                                 [root.path for root in read + write], mounts)
                                   if name not in grants})
                    continue
                holder = holding_root(above, read)
                if holder is not None and not modes_held:
                    blocked[alias] = f"the read root {holder}"
            if not write:  # (a missing one is no mask, and no command can make it)
                continue
            canonical = None
            if isinstance(exc, PermissionError):
                unsearchable.add(alias)
        if canonical is not None and canonical != alias:
            _refuse_repointable(alias, canonical, write, ctx)
        resolved = canonical or os.path.realpath(alias)
        roots = read + write if canonical is not None else write
        names = [name for name in aliases.seen(resolved, [root.path for root in roots], mounts)
                 if name != resolved]
        if canonical is not None:
            grants.setdefault(canonical, PathGrant(path=canonical, alias=alias))
            grants.update({name: PathGrant(path=name, alias=name) for name in names
                           if name not in grants and os.path.lexists(name)})
            continue
        holder = holding_root(resolved, write) or next(
            (root.path for root in write if any(inside(name, root.path) for name in names)),
            None)
        if holder is not None:
            missing.setdefault(resolved, (alias, holder))
    for root in read + write:
        for name in aliases.within("/", root.path, mounts):
            hidden = holding_root(name, tuple(grants.values())) if name != root.path else None
            if hidden is not None:
                raise PolicyError(f"root {root.path} lies inside denied path {hidden} (a "
                                  f"mount shows it at {name})", key="filesystem.deny")
    blocked |= {alias: f"the write root {holder}" for alias, holder in missing.values()
                if alias in unsearchable}
    if blocked:
        dirs = dict.fromkeys(os.path.realpath(aliases.first_unsearchable(alias))
                             for alias in blocked)
        raise UnenforceableError(
            "filesystem.deny",
            "this user may not look up the denied paths "
            + ", ".join(f"{alias} (in {where})" for alias, where in blocked.items())
            + f", so whether they exist is unknown and nothing there can be masked; the "
            f"command could search the directories above them: give them their search bit "
            f"first, with chmod u+x {' '.join(map(shlex.quote, dirs))}, or choose a workspace "
            "that holds none of them")
    if missing:
        holders = dict.fromkeys(holder for _, holder in missing.values())
        listed = "; ".join(f"in the write root {holder}: "
                           + ", ".join(alias for alias, held in missing.values()
                                       if held == holder)
                           for holder in holders)
        raise UnenforceableError(
            "filesystem.deny",
            f"the command could create these denied paths, which do not exist ({listed}); "
            f"make them first, with {_make_all(alias for alias, _ in missing.values())}, or "
            f"choose a workspace that holds none of them")
    return tuple(grants.values())


def _own(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def _in_every_home(raw: str, ctx: CompileContext) -> list[str]:
    """`raw` expanded; one of the home (`{home}`, `~`) in each home of this user, $HOME's
    first."""
    if not (raw == "~" or raw.startswith(("~/", "{home}/")) or raw == "{home}"):
        return [expand(raw, ctx)]
    return [expand(raw, replace(ctx, home=home)) for home in _homes(ctx)]


def _homes(ctx: CompileContext) -> list[str]:
    """This user's homes: $HOME's, then the password database's where it differs."""
    return list(dict.fromkeys(os.path.normpath(home) for home in (ctx.home, ctx.passwd_home)
                              if os.path.isabs(home)))


def _make_all(aliases: Iterable[str]) -> str:
    """One shell command that makes every path of `aliases`, private to this user: a known
    credential file (presets.is_deny_file) empty, anything else a directory. On Windows a PowerShell
    one (new items there inherit their folder's DACL, which in a profile is the user's)."""
    aliases = list(aliases)
    files = [a for a in aliases if is_deny_file(a)]
    dirs = [a for a in aliases if a not in files]
    if sys.platform == "win32":
        return _make_all_powershell(dirs, files)
    # (the files' directories made first: `touch` makes none, and stopped the command there)
    folders = [d for d in dict.fromkeys(os.path.dirname(f) for f in files) if d not in dirs]
    steps = [f"{verb} {' '.join(map(shlex.quote, names))}"
             for verb, names in (("mkdir -p", [*dirs, *folders]), ("touch", files)) if names]
    return f"(umask 077 && {' && '.join(steps)})"


def _make_all_powershell(dirs: list[str], files: list[str]) -> str:
    """`_make_all` for PowerShell, as one script block (`( )` takes one pipeline only): the
    directories (and the files' folders) with -Force, which makes the folders above and leaves
    an existing directory be; the files without it, which would empty a file that exists."""
    def quoted(paths: Iterable[str]) -> str:  # PowerShell takes all four as a single quote
        return ", ".join("'" + re.sub("(['\u2018\u2019\u201a\u201b])", r"\1\1", path) + "'"
                         for path in paths)

    folders = list(dict.fromkeys([*dirs, *(ntpath.dirname(f) for f in files)]))
    steps = [f"New-Item -ItemType Directory -Force -Path {quoted(folders)} | Out-Null"]
    if files:
        steps.append(f"New-Item -ItemType File -Path {quoted(files)} | Out-Null")
    return f"& {{ {'; '.join(steps)} }}"


def _private_home(ctx: CompileContext) -> tuple[tuple[PathGrant, ...], list[tuple[str, str]]]:
    """`filesystem.home = "private"`: the workspace's own home, made if need be, as a write
    grant (stockade/lifecycle/homes.py)."""
    from stockade.lifecycle import homes

    if not ctx.key_dir:
        raise UnenforceableError(
            "filesystem.home", 'no place for private homes: the password database names no '
            'home for this user; set filesystem.home = "host"')
    try:
        workspace = canonical_path(ctx.workspace)
    except OSError:
        raise PolicyError(f"workspace {ctx.workspace} does not exist", key="filesystem.home"
                          ) from None
    home = homes.home_for(workspace, ctx.key_dir)
    homes.ensure(home, workspace)
    return _grants((home,), "filesystem.home", ctx)


def _with_home(home: tuple[PathGrant, ...], policy: Policy,
               env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The environment with HOME the private home, if there is one, and git's global
    configuration in it (~/.gitconfig is a protected name); what the policy sets wins."""
    if not home:
        return env
    from stockade.lifecycle.homes import GIT_CONFIG

    path = home[0].alias
    own = {"HOME": path, "GIT_CONFIG_GLOBAL": os.path.join(path, GIT_CONFIG)}
    assigned = {name for name, _ in policy.env.set}
    return tuple(sorted((dict(env) | {k: v for k, v in own.items() if k not in assigned}
                         ).items()))


def _stockade_state(ctx: CompileContext, read: tuple[PathGrant, ...],
                    write: tuple[PathGrant, ...], home: tuple[PathGrant, ...] = ()
                    ) -> tuple[tuple[PathGrant, ...], tuple[str, ...]]:
    """Stockade's own state directories (every place this user's may be: the ledger, the
    daemon's and the CLI server's sockets, attestations, the seal key) and the private homes'
    directory (beside the seal key's: one place whatever the environment), masked whatever the
    roots say, and every such place resolved, whether it exists or not (a sandbox without a
    mount view refuses a root that holds one: landlock_tier.py). One that does not exist yet
    inside a write root is made now, so it can be masked. The run's own private home (`home`)
    is the only root granted inside one: no sandbox reaches another workspace's home, to plant
    what that workspace's next run reads."""
    from stockade.lifecycle import homes

    grants = []
    places = []
    own = {grant.path for grant in home}
    masked = [(state, "Stockade's state directory")
              for state in statedir.candidates(ctx.host_env, ctx.home)]
    if ctx.key_dir:
        masked.append((ctx.key_dir + homes.SUFFIX, "the sandboxes' private homes"))
    mounts = aliases.table()
    for place, what in masked:
        resolved = os.path.realpath(place)
        # (and each other name a root shows it by: a bind mount of it, or of a directory
        # above it, reaches it past a mask on its own path; issue 29 B1)
        seen = {root.path: aliases.within(root.path, resolved, mounts) for root in read + write}
        names = list(dict.fromkeys([resolved, *(name for found in seen.values()
                                                for name in found)]))
        places += names
        _refuse_inside_state([r for r in read + write if r.path not in own], resolved, what,
                             mounts)
        if not os.path.lexists(resolved) and (holding_root(resolved, write) is not None
                                              or any(seen[root.path] for root in write)):
            try:
                statedir.ensure(resolved)
            except StockadeError as exc:
                raise UnenforceableError(
                    "filesystem.stockade_state",
                    f"Stockade's state directory {resolved} lies inside a write root and "
                    f"cannot be made to be masked ({exc.message})") from None
        grants += [PathGrant(path=name, alias=place if name == resolved else name)
                   for name in names if os.path.lexists(name)]
    return tuple(grants), tuple(sorted(set(places)))


def _refuse_inside_state(roots: Sequence[PathGrant], state: str, what: str,
                         mounts: aliases.Mounts) -> None:
    for root in roots:
        if inside(root.path, state) or aliases.within(state, root.path, mounts):
            raise PolicyError(f"root {root.path} lies inside {what} {state}, which no sandbox "
                              f"may see", key="filesystem")


def _host_code(ctx: CompileContext, write: tuple[PathGrant, ...],
               deny: tuple[PathGrant, ...]
               ) -> tuple[tuple[str, ...], tuple[str, ...], set[str]]:
    """The places of the code the host runs next (hostcode.py) that lie inside a write root,
    resolved, the outermost of each nest, and what each is (hostcode.KINDS): the view makes
    each read-only and pins every directory above it (a rename would carry the mount away);
    and the names the command may not make there (namewatch.c: a kept module's missing
    bytecode cache, and what an import would take before it: attack 31 H1, H2). Refused,
    typed, what no mount can keep: a write root that is such a place or lies inside one, a
    place reached through a symbolic link the command could replace, one missing there (the
    command could make it; a missing user site-packages is made now instead, empty)."""
    if not write:
        return (), (), set()
    found = [(place, _resolved(place.path)) for place in hostcode.places(ctx.host_env)]
    for place, resolved in found:
        if place.kind == "user_site" and not os.path.lexists(resolved) \
                and _below(resolved, write):
            try:
                os.makedirs(resolved, mode=0o700)
            except OSError as exc:
                raise _host_code_refused(place, resolved, f"lies inside a write root and "
                                         f"cannot be made to be kept ({exc.strerror})") from None
    mounts = aliases.table()
    roots = [root.path for root in write]
    found += [(hostcode.Place(name, place.kind), name) for place, resolved in list(found)
              for name in _host_code_names(place, resolved, roots, mounts)]
    # (a link tree in a write root, as setuptools' strict editable install makes, shows the
    # host files the command writes where they lie: each link's target is host code too;
    # attack 29 N2s)
    found += [(hostcode.Place(link, "linked_entry"), _resolved(link))
              for place, resolved in list(found) if place.kind in _LINK_TREES
              and _below(resolved, write) for link in hostcode.links_in(resolved)]
    # (names an import takes first, beside a module kept as its file, under whichever name a
    # write root shows it by (attack 33 A4): those there are kept, the others not made)
    shadowing = [(hostcode.Place(name, place.kind), name) for place, resolved in found
                 if place.kind in ("module", "editable") and os.path.isfile(resolved)
                 and _below(resolved, write) for name in hostcode.shadowing(resolved)]
    unmade = {resolved for place, resolved in found + shadowing
              if (place.kind in ("pycache_dir", "searched", "package_path")
                  or (place, resolved) in shadowing)
              and not os.path.lexists(resolved) and _below(resolved, write)
              and os.path.isdir(os.path.dirname(resolved))}
    found = [(place, resolved) for place, resolved in found + shadowing
             if resolved not in unmade]
    refuse_host_code_copies(list(dict.fromkeys(resolved for _, resolved in found)), write, deny)
    kept = {resolved for _, resolved in found
            if _below(resolved, write) and os.path.lexists(resolved)}
    kept = {path for path in kept if not any(_strictly_inside(path, other) for other in kept)}
    for place, resolved in found:
        _check_host_place(place, resolved, write, kept, mounts)
    kinds = {}
    for place, resolved in found:
        kinds.setdefault(resolved, place.kind)
    return tuple(sorted(kept)), tuple(kinds[path] for path in sorted(kept)), {
        name for name in unmade if not any(inside(name, path) for path in kept)}


_LINK_TREES = ("import_path", "pth_entry", "editable", "user_site")


def _host_code_names(place: hostcode.Place, resolved: str, roots: list[str],
                     mounts: aliases.Mounts) -> list[str]:
    """The other names the write `roots` show the host code at `resolved` by, where the command
    writes it as if it were there: a bind mount of it, or of a part of it (attacks 27 H1, 28
    V1, V2), and the source of each mount below it (a file or directory of the workspace
    bound onto it: attack 28 H5, H8). The program's starting directory is kept only whole, as
    it is by its own path (with "/" for it, every mount would be)."""
    if place.kind == "start":
        names = [name for root in roots for name in aliases.within(root, resolved, mounts)]
    else:
        names = aliases.seen(resolved, roots, mounts)
        for point in mounts.at:
            if point != resolved and aliases.at_or_below(point, resolved):
                names += [name for name in aliases.seen(point, roots, mounts) if name != point]
    return [name for name in dict.fromkeys(names) if name != resolved]


def _check_host_place(place: hostcode.Place, resolved: str, write: tuple[PathGrant, ...],
                      kept: set[str], mounts: aliases.Mounts) -> None:
    def covered(path: str) -> bool:
        return any(inside(path, other) for other in kept)

    for root in write:
        if not inside(root.path, resolved) or place.kind == "start" \
                or (place.kind in ("prefix", "cwd") and root.path != resolved):
            continue  # (a prefix holds more than code: its code directories are places too)
        raise _host_code_refused(place, resolved, f"is the write root {root.path}" if
                                 root.path == resolved else f"holds the write root {root.path}")
    if _below(resolved, write) and not covered(resolved):
        raise _host_code_refused(place, resolved, "does not exist inside a write root, so the "
                                 "command could create it; create it first, or")
    if place.path != resolved and os.sep == "/":  # (_links_to walks POSIX paths)
        roots = [root.path for root in write]
        for link in _links_to(place.path, resolved, "filesystem.host_code"):
            # (under each name a root shows it by: a bind of its directory; attack 28 V3)
            for name in [link, *aliases.seen(link, roots, mounts)]:
                if _below(name, write) and not covered(name):
                    raise _host_code_refused(place, resolved, f"is reached through the "
                                             f"symbolic link {name}, inside a write root, "
                                             "which the command could point elsewhere")


def _host_code_refused(place: hostcode.Place, resolved: str, why: str) -> UnenforceableError:
    return UnenforceableError(
        "filesystem.host_code",
        f"{resolved} ({hostcode.KINDS[place.kind]}, code this host runs outside the sandbox) "
        f"{why}{'' if why.endswith(' or') else ';'} {hostcode.remedy(place.kind)}, or choose "
        f"a workspace that does not hold it")


def _resolved(path: str) -> str:
    try:
        return canonical_path(path)
    except OSError:  # (missing: resolved as far as it exists)
        return os.path.realpath(path)


def _below(path: str, roots: tuple[PathGrant, ...]) -> bool:
    """Whether `path` lies strictly below one of `roots`."""
    return any(_strictly_inside(path, root.path) for root in roots)


def _strictly_inside(path: str, root: str) -> bool:
    return path != root and inside(path, root)


def with_read_roots(request: LaunchRequest, roots: Sequence[str]) -> LaunchRequest:
    """`request` with the absolute paths `roots` readable too, resolved and checked as
    `compile_policy` resolves and checks a policy's own read roots (a warm sandbox's agent
    needs its interpreter and Stockade's package: session/boot.py)."""
    ctx = CompileContext(workspace=request.cwd, home=os.path.expanduser("~"), tmp=None,
                         host_env={})
    added, links = _grants(tuple(roots), "filesystem.read", ctx)
    mounts = aliases.table()
    for state in request.stockade_state:
        _refuse_inside_state(added, state, "Stockade's state (or private homes) directory",
                             mounts)
    merged = {grant.path: grant for grant in request.read}
    for grant in added:
        merged.setdefault(grant.path, grant)
    read = tuple(sorted(merged.values(), key=lambda g: g.path))
    _refuse_planted_links(links, [], read, request.write)
    _check_overlaps(read, request.write, tuple(g for g in request.deny
                                               if g.path not in request.stockade_state))
    return replace(request, read=read)


def _check_overlaps(read: tuple[PathGrant, ...], write: tuple[PathGrant, ...],
                    deny: tuple[PathGrant, ...]) -> None:
    for hidden in deny:
        for kind, roots in (("read", read), ("write", write)):
            for root in roots:
                if inside(root.path, hidden.path):
                    raise PolicyError(
                        f"{kind} root {root.path} lies inside denied path {hidden.path}",
                        key="filesystem.deny",
                    )


def _resolve_cwd(cwd: str | os.PathLike | None, policy: Policy, ctx: CompileContext,
                 roots: tuple[PathGrant, ...]) -> str:
    _check_path(cwd, "cwd")
    if cwd is not None and not os.fspath(cwd):
        raise UsageError("cwd is an empty path: name a directory (or leave cwd out)")
    raw = os.fspath(cwd) if cwd is not None else policy.process.cwd or "{workspace}"
    try:
        resolved = canonical_path(expand(raw, ctx))
    except OSError:
        raise PolicyError(f"working directory {raw} does not exist", key="process.cwd") from None
    if not os.path.isdir(resolved):
        raise PolicyError(f"working directory {raw} is not a directory", key="process.cwd")
    if not any(inside(resolved, root.path) for root in roots):
        raise PolicyError(f"working directory {resolved} is not inside any read or write root",
                          key="process.cwd")
    return resolved


def _credentials(policy: Policy, ctx: CompileContext, roots: tuple[PathGrant, ...],
                 deny: list[PathGrant] | tuple[PathGrant, ...]) -> tuple[CredentialSpec, ...]:
    """`network.credentials` for this launch: each with a fresh placeholder, its file absolute.
    A file the sandbox could read (in a root, not denied) is refused: its secret would be
    there for the command to take."""
    specs = []
    proxy_names = proxy_environment(SANDBOX_PORT)
    for index, credential in enumerate(policy.network.credentials):
        key = f"network.credentials[{index}]"
        if credential.env in proxy_names:
            raise PolicyError(f"{credential.env} is a variable the proxy sets", key=f"{key}.env")
        source = ""
        if credential.from_file:
            source = os.path.abspath(expand(credential.from_file, ctx))
            real = os.path.realpath(source)
            seen = [root.path for root in roots if inside(real, root.path)]
            if seen and not any(inside(real, hidden.path) for hidden in deny):
                raise PolicyError(f"{credential.from_file} lies in {seen[0]}, which the sandbox "
                                  "reads: its secret would be in the sandbox; keep the file "
                                  "outside the roots, or deny it (filesystem.deny)",
                                  key=f"{key}.from_file", code="credential_exposed")
        specs.append(CredentialSpec(
            credential.name, credential.host, credential.env,
            f"stockade-cred-{credential.name}-{secrets.token_hex(16)}", credential.header,
            credential.prefix, credential.basic_user, credential.query, credential.from_env,
            source))
    return tuple(specs)


def _with_credentials(credentials: tuple[CredentialSpec, ...],
                      env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Each credential's placeholder in its variable (over anything else of that name). A
    credential's source variable passed in under its own name is refused: the secret would be
    in the sandbox's environment."""
    if not credentials:
        return env
    placed = {spec.env: spec.placeholder for spec in credentials}
    for index, spec in enumerate(credentials):
        if spec.from_env and spec.from_env not in placed and spec.from_env in dict(env):
            raise PolicyError(f"{spec.from_env} would be passed into the sandbox (env.pass or "
                              "env.set) and holds the secret: drop it there, or name it in "
                              "this credential's env", key=f"network.credentials[{index}]."
                              "from_env", code="credential_exposed")
    return tuple(sorted((dict(env) | placed).items()))


def _with_proxy(policy: Policy,
                env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """In allowlist mode, the proxy variables (they win over anything the policy set)."""
    if policy.network.mode != "allowlist":
        return env
    return tuple(sorted(with_proxy(dict(env), proxy_environment(SANDBOX_PORT)).items()))


def _expand_env(policy: Policy, ctx: CompileContext) -> tuple[tuple[str, str], ...]:
    out = []
    for name, value in policy.env.set:
        if any(value == "{" + p + "}" or value.startswith("{" + p + "}/") for p in PLACEHOLDERS):
            value = expand(value, ctx)
        out.append((name, value))
    return tuple(out)
