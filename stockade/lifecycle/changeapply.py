"""Applying an overlaid run's changes to the real workspace: all or nothing refused first.

A change is refused when the policy never lets it land (under a protected name or a denied
path, what of a repository is guarded, a device or other special file): the sandbox's mounts
kept the command from making it, and this holds again should an upper layer say otherwise.
A change conflicts when the host's entry is no longer what it was when the run started
(changescan.fingerprint), unless it already is what the run left (so applying again after a
crash part-way finishes the job). What the review could not show (changescan: an unreadable
entry, a tree too deep) is refused too: nothing lands that was not shown. Every operation on
the workspace goes through directory descriptors opened without following symbolic links,
beneath the write root: a link the run left is applied as a link, never followed, and a
directory the host swaps for a link meanwhile stops the apply (`changes_conflict`) rather
than lead it anywhere.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stockade.errors import ChangesError
from stockade.lifecycle import aliases, statedir, treewalk
from stockade.lifecycle.changescan import (
    Change,
    Fingerprint,
    fingerprint,
    read_regular,
    same_as_host,
)
from stockade.policy.model import DEFAULT_PROTECTED, HOME_CODE, XDG_CODE
from stockade.policy.presets import DENY_DEFAULTS
from stockade.visibletext import visible

# What of a guarded repository stays read-only (docs/policy.md, "Git in a write root"): in a gitdir.
GUARDED_GIT = ("config", "config.worktree", "hooks", "commondir", "gitdir")


def never_applied(roots: Iterable[str]) -> tuple[str, ...]:
    """What no change set over the write `roots` ever writes, whatever its run's policy says
    (defence in depth: a set that names a policy of its own is only as good as its seal): the
    credential stores every preset denies, the home directory's own protected names (shell
    start-up files, git's and agents' configuration) and HOME_CODE, in the home the password
    database names and in $HOME (and what of HOME_CODE lies below $XDG_CONFIG_HOME and
    $XDG_DATA_HOME), each as written, resolved and as a root shows it (_both)."""
    mounts = aliases.table()
    homes = _homes(roots, mounts)
    found = {path.replace("{home}", home) for path in DENY_DEFAULTS for home in homes}
    found |= {os.path.join(home, name) for name in DEFAULT_PROTECTED + HOME_CODE
              for home in homes}
    found |= {os.path.join(top, name) for variable, names in XDG_CODE.items()
              for top in _both(os.environ.get(variable, ""), roots, mounts) for name in names}
    return tuple(sorted(os.path.normpath(path) for path in found if os.path.isabs(path)))


def _homes(roots: Iterable[str], mounts: aliases.Mounts) -> set[str]:
    """$HOME and the password database's home, each by every name of _both."""
    return {form for home in (os.path.expanduser("~"), statedir.passwd_home())
            for form in _both(home, roots, mounts)}


def _both(path: str, roots: Iterable[str], mounts: aliases.Mounts) -> set[str]:
    """An absolute `path` as written, with its links resolved, and as each of the `roots`
    shows it (none for another): a change set records its write roots resolved, so a home
    reached through a link (/home -> /var/home) must be known by both names (issue 29 L1),
    and one a root shows at a second path (a bind mount) by that one too (B1)."""
    if not os.path.isabs(path):
        return set()
    resolved = os.path.realpath(path)
    return {os.path.normpath(path), resolved} | {
        name for root in roots for name in aliases.within(root, resolved, mounts)}


@dataclass(frozen=True)
class HomeConfig:
    """What `apply` lands only when asked (`home_config=True`, `stockade apply --home-config`):
    of each of `homes`, the home itself (its mode) and what lies at or below its top-level
    hidden entries (`.*`: every program's configuration, caches, `.local`); and the `places`
    (the user base of this Python, which PYTHONUSERBASE may put elsewhere). HOME_CODE, what
    is known to run code, is never applied; it stays incomplete (issue 29 A1: 31 kinds of
    file found in one round), so the rest waits for the user."""

    homes: tuple[str, ...]
    places: tuple[str, ...]

    def covers(self, path: str) -> bool:
        for home in self.homes:
            if path == home:
                return True
            if _at_or_below(path, home):
                top = path[len(home.rstrip("/")) + 1:].split("/")[0]
                if top.startswith("."):
                    return True
        return any(_at_or_below(path, place) for place in self.places)


HOME_CONFIG_OPTION = "stockade apply --home-config"


def home_config(roots: Iterable[str]) -> HomeConfig:
    """This user's HomeConfig for a change set over the write `roots`: the home the password
    database names and $HOME (each by every name of _both)."""
    import site

    mounts = aliases.table()
    return HomeConfig(tuple(sorted(_homes(roots, mounts))),
                      tuple(sorted(_both(site.getuserbase(), roots, mounts))))


def home_refusals(changes: Iterable[Change], home: HomeConfig) -> list[str]:
    """The changes `home` covers, each as one line naming the option that lands them."""
    return [f"{change.kind} {visible(change.path)}: the home directory's start-up files, "
            f"configuration or programs, which host programs run or read: land them, once "
            f"reviewed, with `{HOME_CONFIG_OPTION}` (API: apply(home_config=True))"
            for change in changes if home.covers(change.path)]


def refusals(changes: Iterable[Change], protected: Iterable[str], deny: Iterable[str],
             git: str, never: Iterable[str]) -> list[str]:
    """The changes the policy never lets land, and those at or below a path of `never`
    (never_applied), each as one line."""
    names = {name.casefold() for name in protected}
    if git == "read-only":
        names.add(".git")
    found = []
    for change in changes:
        parts = change.rel.split("/")
        folded = [p.casefold() for p in parts]
        why = ""
        if change.kind == "unshown":
            why = f"the review cannot show it ({change.note})"
        elif names & set(folded):
            why = "under a protected name"
        elif any(_at_or_below(change.path, d) for d in deny):
            why = "under a denied path"
        elif any(_at_or_below(change.path, n) for n in never):
            why = ("a credential store or a start-up file of the home directory, never "
                   "written from a change set whatever its run's policy (make the change "
                   "yourself if you meant it)")
        elif git == "guarded" and _guarded_git(folded, change.type):
            why = "a repository's guarded configuration, hooks or pointer"
        elif change.kind != "deleted" and change.type == "other":
            why = "a device, fifo or socket"
        if why:
            found.append(f"{change.kind} {visible(change.path)}: {why}")
    return found


def _at_or_below(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _guarded_git(parts: list[str], kind: str) -> bool:
    if parts[-1] == ".git" and kind != "dir":
        return True  # a .git file: which gitdir git uses
    for index, part in enumerate(parts[:-1]):
        if part == ".git" and parts[index + 1] in GUARDED_GIT:
            return True
    return False


def conflicts(changes: list[Change], base: dict[str, dict[str, Fingerprint]]) -> list[str]:
    """The changes whose host entry changed since the run started, each as one line."""
    found = []
    adding = {(c.root, c.rel) for c in changes if c.kind != "deleted" and c.type == "dir"}
    # (what the run replaced by another type, `rm -rf d; echo x > d`: its deletion's own check
    # says whether the host changed it, issue 29 ov2)
    replaced = {(c.root, c.rel) for c in changes if c.kind == "deleted"}
    for change in changes:
        was = base[change.root]
        host = change.path
        now = _lstat(host)
        shown = visible(host)
        if change.kind == "deleted":
            if now is None:
                continue
            if fingerprint(now)[0] == "dir":
                moved = _moved_below(change.root, change.rel, was)
                if moved:
                    found.append(f"{shown}: changed on the host since the run started "
                                 f"({moved})")
                continue
            if fingerprint(now) != was.get(change.rel):
                found.append(f"{shown}: changed on the host since the run started")
            continue
        parent = os.path.dirname(change.rel)
        if parent and (change.root, parent) not in adding and \
                not _is_dir(_lstat(os.path.join(change.root, parent))):
            found.append(f"{shown}: its directory is gone from the host")
            continue
        if now is None:
            if change.kind == "modified":
                found.append(f"{shown}: deleted on the host since the run started")
            continue
        if change.kind == "added" and change.type == "dir" and _is_dir(now):
            continue  # made on both sides: its contents are checked one by one
        if change.kind == "added" and (change.root, change.rel) in replaced:
            continue
        if change.kind == "added" or fingerprint(now) != was.get(change.rel):
            if not same_as_host(change.upper, host):
                what = "created" if change.kind == "added" else "changed"
                found.append(f"{shown}: {what} on the host since the run started")
    return found


def _moved_below(root: str, rel: str, was: dict[str, Fingerprint]) -> str:
    """What changed on the host below the directory `rel` since the baseline, if anything
    (what cannot be listed counts as changed: it would be deleted unseen)."""
    top = os.path.join(root, rel)
    for listing in treewalk.walk(top):
        if listing.problem:
            return f"{visible(listing.rel)}: {listing.problem}"
        for name, info in listing.entries:
            sub = os.path.join(listing.rel, name)
            if was.get(os.path.join(rel, sub)) != fingerprint(info):
                return f"{visible(sub)} is new or changed"
    return ""


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # (a path the host made too long, a directory it made unsearchable)
        raise ChangesError("changes_conflict", f"{visible(path)}: cannot be looked at on the "
                           f"host ({exc.strerror}); nothing was applied") from None


def _is_dir(info: os.stat_result | None) -> bool:
    return info is not None and stat.S_ISDIR(info.st_mode)


def apply(changes: list[Change]) -> None:
    """Make each change in its write root: deletions (deepest first), then the rest
    (parents first, as scanned), then the modes of directories (deepest first: one the run
    made read-only is filled before). A workspace the host changes meanwhile so that a
    path no longer leads where it did (a directory swapped for a link) stops it, typed,
    naming the path; what was applied before stays (`stockade apply` again shows the rest as
    conflicts)."""
    roots: dict[str, int] = {}
    try:
        for change in sorted((c for c in changes if c.kind == "deleted"),
                             key=lambda c: -c.rel.count("/")):
            _step(change, _delete, roots, change.rel)
        for change in changes:
            if change.kind in ("added", "modified"):
                _step(change, _put, roots, change)
        for change in sorted((c for c in changes if c.kind in ("added", "modified")
                              and c.type == "dir"), key=lambda c: -c.rel.count("/")):
            _step(change, _set_mode, roots, change)
    finally:
        for fd in roots.values():
            os.close(fd)


def _step(change: Change, act: Callable[..., None], roots: dict[str, int],
          *args: object) -> None:
    """`act(root_fd, *args)` for `change`; the root is opened here too, so a root the host
    swapped for a link stops the apply as any other path does (typed, never a traceback)."""
    try:
        act(_root_fd(roots, change.root), *args)
    except ChangesError:
        raise
    except OSError as exc:
        raise ChangesError(
            "changes_conflict", f"{visible(change.path)}: cannot be applied ({exc.strerror}):"
            " the workspace changed on the host while the changes were applied (a directory "
            "on its path gone, or swapped for a link, which is never followed) or refuses "
            "the write; what was applied before stays, the rest is kept pending",
            (visible(change.path),)) from None


def _root_fd(roots: dict[str, int], root: str) -> int:
    if root not in roots:
        roots[root] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return roots[root]


def _parent(root_fd: int, rel: str) -> tuple[int, str]:
    """A descriptor of the directory holding `rel` beneath the root, and its last name."""
    parent, name = os.path.split(rel)
    return beneath(root_fd, parent), name


def _open_directory(name: str, dir_fd: int) -> int:
    """The directory `name` in `dir_fd`, never through a symbolic link."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dir_fd)


def beneath(root_fd: int, rel: str) -> int:
    """A descriptor of the directory `rel` beneath the one open at `root_fd`, walked one name
    at a time without following a symbolic link (or magic link) or leaving by "..": what a
    host process may have put in the workspace during the run cannot lead a write out."""
    fd = os.dup(root_fd)
    try:
        for part in rel.split("/") if rel else ():
            if part in ("", ".", ".."):
                raise ChangesError("changes_refused", f"{rel!r}: not a plain relative path")
            inner = _open_directory(part, fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _delete(root_fd: int, rel: str) -> None:
    fd, name = _parent(root_fd, rel)
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=fd)  # (symlink-safe: it never follows one)
        else:
            os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass  # gone already (applied before a crash, or deleted on the host too)
    finally:
        os.close(fd)


def _put(root_fd: int, change: Change) -> None:
    if not change.rel:
        return  # (the root itself: only its mode changes, set last)
    fd, name = _parent(root_fd, change.rel)
    try:
        owner = _owner_for(fd, name)
        if change.type == "dir":
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            target = _open_directory(name, fd)
            try:
                os.fchmod(target, stat.S_IMODE(os.fstat(target).st_mode) | stat.S_IRWXU)
                if owner is not None:
                    os.fchown(target, *owner)
            finally:
                os.close(target)
            return
        temporary = f".{name}.stockade-apply"
        _remove_quietly(fd, temporary)
        if change.type == "symlink":
            os.symlink(os.readlink(change.upper), temporary, dir_fd=fd)
        else:
            _copy_file(change.upper, fd, temporary, change.mode)
        if owner is not None:
            os.chown(temporary, *owner, dir_fd=fd, follow_symlinks=False)
            if change.type == "file":
                # (chown may clear bits of the mode: it is set again, setuid/setgid never)
                os.chmod(temporary, change.mode, dir_fd=fd)
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _set_mode(root_fd: int, change: Change) -> None:
    """A directory's mode as the run left it (changescan.landed: never setuid or setgid)."""
    target = beneath(root_fd, change.rel)
    try:
        os.fchmod(target, change.mode)
    finally:
        os.close(target)


def _copy_file(source: str, dir_fd: int, name: str, mode: int) -> None:
    """The regular file `source` (never a fifo or device: changescan.read_regular) copied to
    `name` in `dir_fd`, with `mode` and its modification time."""
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600, dir_fd=dir_fd)
    try:
        with read_regular(source) as src:
            while chunk := src.read(1 << 20):
                os.write(out, chunk)
            info = os.fstat(src.fileno())
        os.fchmod(out, mode)
        os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        os.fsync(out)
    finally:
        os.close(out)


def _owner_for(dir_fd: int, name: str) -> tuple[int, int] | None:
    """As root: the owner the entry has now, else its directory's (what root applies into a
    user's workspace stays the user's). Otherwise None: what this user makes is theirs."""
    if os.getuid() != 0:
        return None
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        info = os.fstat(dir_fd)
    return info.st_uid, info.st_gid


def _remove_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def refuse(kind: str, lines: list[str], what: str) -> ChangesError:
    listed = "".join(f"\n  {line}" for line in lines)
    return ChangesError(kind, f"{what} ({len(lines)}); nothing was applied:{listed}",
                        tuple(lines))
