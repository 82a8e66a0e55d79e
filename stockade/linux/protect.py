"""Find every existing occurrence of a protected name (`.agents`, …) in a write root, and every
repository there.

The walk runs on a descriptor of the root and never follows symlinks. A protected name is
protected whole. So is `.git` when `filesystem.git` is "read-only": a `.git` *file* (a worktree
or submodule pointer) too, and the gitdir it points to when that lies inside a write root.
When it is "guarded" (the default), each `.git` is a repository whose hooks, configuration and
pointers are protected and the rest writable (gitdirs.py); its contents are walked like any
directory's. A protected name or `.git` that is a symlink is refused: the sandbox could
delete the link and put its own directory in its place, and no mount can stop that.

The same walk finds regular files with more than one hard link: another name for them may lie
outside every root, so they are mounted read-only as well (`linked`); and unix socket files
(`socket`), which a process outside the sandbox may be listening on, so the Linux backend can
mask them (a VM guest reaches no host socket through its shares).

A hard link is the denied file itself under another name: a mask covers one name, and a
Landlock rule holds for the inode, every name of it. So each multiply-linked file that is
denied (`denied_files`: a denied path, or a file inside a denied directory) is known by its
inode, and each of its names the walk meets in a write root is masked as the denied path is
(`aliases`; its directories pinned), and so is every path at which a mount shows such a name in
any root (`shown_in`: a read root that is a bind mount of a directory of the write root shows
the link at a second path, attack 9 dl9c). A denied file with more names than were found has
the read roots looked through for the others (`refuse_unfound`): one there refuses the launch,
named; none there lies outside every root, where it shows nothing, and the launch goes on.

A mount covers a name, and moves with it: renaming any directory above a re-mounted or masked
object carries the mount away and frees the path for a replacement (which a later run, or the
host, then trusts). So every directory from a write root down to each object a view covers in
it (protected names, what of a repository is guarded, the socket masks, and the `masked` paths
the caller gives: denied paths and Stockade's state directories; the `readonly` paths: the
code the host runs next, launch/hostcode.py) is pinned: "keep" guards,
each re-mounted on itself, which makes it a mount point that rename and rmdir refuse (EBUSY).

`guards` turns what the walk found into what a view re-mounts (the Linux backend's mounts,
stockade/linux/mnt.py, and a VM guest's init, stockade/vm/machine.py); `walk` also says which
socket files it met.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial

from stockade.errors import UnenforceableError
from stockade.lifecycle import aliases as mount_aliases
from stockade.linux import gitdirs
from stockade.linux.mountapi import (
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    openat2,
)
from stockade.policy.model import protected_whole

# The kernel takes a path of at most PATH_MAX bytes, its NUL included: an object at a longer
# path can be neither walked to nor re-mounted or masked by its path.
PATH_MAX = 4096


@dataclass(frozen=True)
class Occurrence:
    """A protected object: `rel` is its path below the write root `root`."""

    root: str
    rel: str
    is_dir: bool
    linked: bool = False   # a multiply-linked file (also when a protected name)
    socket: bool = False   # a unix socket file, not a protected name
    repository: bool = False  # a guarded `.git` (directory or file), not a protected name
    inode: tuple[int, int] = (0, 0)  # a linked file's (st_dev, st_ino)


@dataclass(frozen=True)
class Guard:
    """A path in a write root that a view re-mounts on itself: read-only (`kind` "protected":
    a protected name, the gitdir a `.git` file names, what of a repository is guarded, or a
    multiply-linked file), or as it is
    (`kind` "keep": a directory between a root and a protected object, made a mount point so
    it cannot be renamed away and another planted at its path)."""

    path: str
    kind: str
    is_dir: bool

    @property
    def depth(self) -> int:
        return 0 if self.path == "/" else self.path.count("/")


# Entries looked at inside the denied directories, at most, per launch: more refuses it (their
# files could not all be told apart from what a root shows). The defaults' are a few dozen.
DENIED_ENTRIES_MAX = 50000


@dataclass
class DeniedFile:
    """A denied regular file with more than one hard link: `path` is a denied name of it,
    `links` its link count and `names` every name of it known to be hidden."""

    path: str
    links: int
    names: set[str]
    # Each name's place, (device, inode of its directory, name): one entry a bind mount shows
    # at two paths is one name of the file, not two (attack 8, dl2).
    places: set[tuple[int, int, str]] = field(default_factory=set)

    def add(self, path: str) -> None:
        self.names.add(path)
        try:
            above = os.stat(os.path.dirname(path))
        except OSError:
            return  # (unplaced: not counted, so the file stays refused)
        self.places.add((above.st_dev, above.st_ino, os.path.basename(path)))


def denied_files(paths: Iterable[str]) -> dict[tuple[int, int], DeniedFile]:
    """Every multiply-linked regular file among the denied `paths` (each existing, canonical)
    and inside those that are directories, by (st_dev, st_ino). What the walk cannot open (a
    directory this user may not list) is passed over: the sandbox, no more privileged, cannot
    reach a file by that name either."""
    found: dict[tuple[int, int], DeniedFile] = {}
    budget = [DENIED_ENTRIES_MAX]
    for path in paths:
        try:
            info = os.lstat(path)
        except OSError:
            continue  # (gone: nothing there to hide)
        if stat.S_ISDIR(info.st_mode):
            _denied_directory(found, path, budget)
        else:
            _denied_name(found, info, path)
    return found


def _denied_name(found: dict[tuple[int, int], DeniedFile], info: os.stat_result,
                 path: str) -> None:
    """Record `path` (lstat `info`) if it is a name of a multiply-linked regular file."""
    if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
        return
    known = found.setdefault((info.st_dev, info.st_ino), DeniedFile(path, info.st_nlink, set()))
    known.add(path)


def _denied_directory(found: dict[tuple[int, int], DeniedFile], path: str,
                      budget: list[int]) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for dirpath, dirnames, filenames, dir_fd in _walk(path, fd, "denied directory",
                                                          unlisted=_unlisted_denied(path)):
            budget[0] -= len(dirnames) + len(filenames)
            if budget[0] < 0:
                raise UnenforceableError(
                    "filesystem.deny",
                    f"the denied directories hold more than {DENIED_ENTRIES_MAX} entries "
                    f"(the last looked at: {path}), too many to tell every other name of their "
                    "files (a hard link) apart at each launch; deny a smaller directory")
            for name in filenames:
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except PermissionError:
                    raise _unlisted_denied(path)(os.path.join(dirpath, name)) from None
                except OSError:
                    continue  # (gone since it was listed)
                _denied_name(found, info, os.path.normpath(os.path.join(path, dirpath, name)))
    finally:
        os.close(fd)


def _unlisted_denied(denied: str) -> Callable[[str], UnenforceableError]:
    def refusal(rel: str) -> UnenforceableError:
        place = os.path.normpath(os.path.join(denied, rel))
        return UnenforceableError(
            "filesystem.deny",
            f"{place} in the denied {denied} can be reached but not read whole by this user, "
            "so the other names (hard links) of the files in it cannot be looked for; make it "
            f"readable and searchable by you (chmod u+rx), or run as root")
    return refusal


# Entries looked at in the read roots, at most, per launch, for the other names of a denied file
# none of the denied paths and write roots holds: more refuses it (its other names could not all
# be told apart from what the roots show). The system's read roots hold a few hundred thousand.
READ_ENTRIES_MAX = 1_000_000


def refuse_unfound(denied: dict[tuple[int, int], DeniedFile], read: list[str]) -> None:
    """Refuse, typed, a denied file with a name that is neither denied nor met by the walk of
    the write roots (where it would be masked) when that name lies in one of the `read` roots
    (the read roots, and a write root that is a file: no walk looks there), where it would show
    the file, or when they cannot all be looked through. A name outside every root shows
    nothing: no refusal."""
    unmet = {inode: known for inode, known in denied.items()
             if len(known.places) < known.links}
    if unmet:
        _look_in_read_roots(unmet, read)


def _look_in_read_roots(unmet: dict[tuple[int, int], DeniedFile], read: list[str]) -> None:
    """Walk the `read` roots for another name of an `unmet` file, refusing at the first (the
    old refusal, `_unfound`, where a directory cannot be looked through). Only what lies on
    the files' filesystems is walked: each root, and each mount point below one, whose device
    is a file's or one of its names' directories' (an overlay shows its own to directories, and
    a file's may be its layer's), no directory of another device, and each directory once
    (nested roots, a bind of one in another). Each entry is lstat'ed: a directory entry's inode
    number need not be the file's st_ino (an overlay's). An overlay in a read root is walked
    through its layers, which lie on their own filesystems: a name there is shown at the
    overlay's point (attack 34 H2)."""
    devices = {device for device, _ in unmet}
    devices |= {place[0] for known in unmet.values() for place in known.places}
    mounts = mount_aliases.table()
    starts = sorted({(point, root, point) for root in read
                     for point in [root, *mounts.at, *mounts.unresolved]
                     if mount_aliases.at_or_below(point, root)}
                    | {(layer, root, point) for root in read
                       for point, mount in mounts.at.items()
                       if mount_aliases.at_or_below(point, root)
                       for layer in (*mount.layers, *mount.data)})
    first = next(iter(unmet.values()))
    seen: set[tuple[int, int]] = set()
    budget = READ_ENTRIES_MAX
    for start, root, shown in starts:
        info = mount_aliases.look(start)  # (None: the command cannot reach it either)
        if info is None or info.st_dev not in devices:
            continue
        if stat.S_ISREG(info.st_mode):  # (a root that is a file)
            _refuse_shown(unmet, info, os.stat(os.path.dirname(start)), start, root)
            continue
        if not stat.S_ISDIR(info.st_mode) or not _listable(start, None, start, first):
            continue
        fd = os.open(start, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for dirpath, dirnames, filenames, dir_fd in _walk(
                    start, fd, "read root", unlisted=partial(_unlisted_read, first, start)):
                here = os.fstat(dir_fd)
                if (here.st_dev, here.st_ino) in seen or here.st_dev not in devices:
                    dirnames.clear()  # (walked already, or a mount of another filesystem)
                    continue
                seen.add((here.st_dev, here.st_ino))
                budget -= len(dirnames) + len(filenames)
                if budget < 0:
                    raise _unfound(first, f"the read roots hold more than {READ_ENTRIES_MAX} "
                                          "entries, too many to look through at each launch")
                dirnames[:] = [name for name in dirnames if _listable(
                    name, dir_fd, os.path.join(start, dirpath, name), first)]
                for name in filenames:
                    try:
                        entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # (gone since it was listed)
                    if (entry.st_dev, entry.st_ino) in unmet:  # (its path made only then)
                        _refuse_shown(unmet, entry, here,
                                      os.path.normpath(os.path.join(shown, dirpath, name)), root)
        finally:
            os.close(fd)


def _refuse_shown(unmet: dict[tuple[int, int], DeniedFile], entry: os.stat_result,
                  above: os.stat_result, path: str, root: str) -> None:
    """Refuse, typed, `path` (lstat `entry`, its directory `above`) in the read root `root` if
    it is a name of an `unmet` file that is not one of its hidden names."""
    known = unmet.get((entry.st_dev, entry.st_ino))
    if known is not None and stat.S_ISREG(entry.st_mode) \
            and (above.st_dev, above.st_ino, os.path.basename(path)) not in known.places:
        raise UnenforceableError(
            "filesystem.deny",
            f"the denied file {known.path} has {known.links} hard links, and its other name "
            f"{path} shows it in the read root {root}: deny that name too, or remove the link")


def _listable(name: str, dir_fd: int | None, path: str, first: DeniedFile) -> bool:
    """Whether the directory `name` (in `dir_fd`; at `path`) may be listed and searched by
    this user; False for another user's the command may not enter (nor reach a name in);
    refused, typed (`first`'s old refusal), where the command may enter it, or where it is this
    user's (whose mode the landlock tier's command can set). Asked with the effective
    credentials, capabilities included, as the walk's own opens are (a user namespace's root
    lists what its mapped user owns whatever the mode)."""
    if os.access(name, os.R_OK | os.X_OK, dir_fd=dir_fd, effective_ids=True,
                 follow_symlinks=False):
        return True
    if os.access(name, os.X_OK, dir_fd=dir_fd, effective_ids=True, follow_symlinks=False) \
            or os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid == os.geteuid():
        raise _unlisted_read(first, path, ".")
    return False


def _unlisted_read(known: DeniedFile, top: str, rel: str) -> UnenforceableError:
    return _unfound(known, f"{os.path.normpath(os.path.join(top, rel))} there cannot be read "
                           "whole by this user")


def _unfound(known: DeniedFile, why: str) -> UnenforceableError:
    """The refusal of a denied file whose other names cannot all be looked for: `why`."""
    return UnenforceableError(
        "filesystem.deny",
        f"the denied file {known.path} has {known.links} hard links, and only "
        f"{len(known.places)} of its names lie where the sandbox hides them (the denied "
        f"paths and the write roots); another may lie in a read root ({why}), where it would "
        f"show the file: remove the other links (find / -xdev -samefile {known.path} "
        "lists them) or deny their names too")


def guards(roots: list[tuple[str, int]], names: frozenset[str],
           git: str = "guarded", masked: tuple[str, ...] = (),
           readonly: tuple[str, ...] = ()) -> list[Guard]:
    """What to re-mount in the write roots `roots` (each a directory's path and a descriptor on
    it) for the protected `names` and `.git` protected as `git` says (policy.model.GIT_MODES),
    and the `readonly` paths (each existing, inside a root), and to pin above the `masked`
    paths (each existing): the kept directories, ancestors first, then the protected objects,
    ancestors first."""
    return walk(roots, names, git, masked, readonly=readonly).guards


@dataclass(frozen=True)
class Walked:
    """What `walk` found: the re-mounts and pins (`guards`), the unix socket files, and the
    other names of denied files (`aliases`, each to be masked as a denied path is)."""

    guards: list[Guard]
    sockets: list[str]
    aliases: list[str]


def walk(roots: list[tuple[str, int]], names: frozenset[str],
         git: str = "guarded", masked: tuple[str, ...] = (), *,
         pin_sockets: bool = False, readonly: tuple[str, ...] = (),
         denied: Mapping[tuple[int, int], DeniedFile] | None = None,
         shown_in: tuple[str, ...] = (), make: bool = True) -> Walked:
    """`guards`, the paths of the unix socket files in the roots (whose directories are pinned
    too when `pin_sockets`: the Linux backend masks them), and each name met of a `denied` file
    (denied_files) that is not denied itself, its directories pinned, with every other path a
    mount shows it at in the roots `shown_in` (every root of the launch, read ones too); each
    name is added to the file's `names`. Not `make` (a view prepared ahead): nothing is made
    on the host, and what a repository's guard would make is refused (gitdirs.py)."""
    whole = protected_whole(names, git, guards_git=True)
    guard_git = git == "guarded" and ".git" not in {name.casefold() for name in whole}
    repositories = gitdirs.Repositories([root for root, _ in roots], make)
    items: dict[str, Guard] = {}
    keep: dict[str, Guard] = {}
    sockets: list[str] = []
    aliases: list[str] = []
    mounts: list[mount_aliases.Mounts] = []  # (the table, read at the first denied name met)
    for root, root_fd in roots:
        for occ in find(root, root_fd, whole, guard_git, frozenset(masked)):
            path = os.path.join(root, occ.rel)
            if occ.socket:
                sockets.append(path)
                if pin_sockets:
                    _pin_everywhere(keep, roots, path)
            elif occ.linked and denied and occ.inode in denied:
                known = denied[occ.inode]
                mounts = mounts or [mount_aliases.table()]
                for name in [path, *mount_aliases.seen(path, list(shown_in), mounts[0])]:
                    if name not in known.names:  # (a denied path itself is masked already)
                        known.add(name)
                        aliases.append(name)
                        _pin_everywhere(keep, roots, name)
            elif occ.linked:
                items[path] = Guard(path, "protected", False)
            elif occ.repository:
                repositories.found(path, occ.is_dir)
            else:
                _add_everywhere(items, keep, roots, path, occ.is_dir)
                if not occ.is_dir and os.path.basename(occ.rel).casefold() == ".git":
                    target = repositories.pointer(path, "gitdir: ")  # protected whole too
                    if target:
                        _add_everywhere(items, keep, roots, target, True)
    for path, is_dir in repositories.guarded():
        _add_everywhere(items, keep, roots, path, is_dir)
    for path in masked:
        _pin_everywhere(keep, roots, path)
    for path in readonly:
        _add_everywhere(items, keep, roots, path, os.path.isdir(path))
    _protect_other_names(items, keep, roots)
    return Walked(sorted(keep.values(), key=lambda g: g.depth)
                  + sorted(items.values(), key=lambda g: g.depth), sockets, aliases)


def _protect_other_names(items: dict[str, Guard], keep: dict[str, Guard],
                         roots: list[tuple[str, int]]) -> None:
    """Protect every other path at which a mount shows a protected object in a write root (a
    bind of `.vscode` into a second write root, of `.git/hooks` or `.mcp.json` elsewhere in the
    same one: attack 12, P1; a write root that is a directory of another under a second name,
    which shows what git's configuration protects there: attack 13, E1): a re-mount covers one
    name, and the walk finds names by name. Nothing to do, and one read of the mount table,
    where no mount point lies in a write root and no write root has another name."""
    writes = [root for root, _ in roots]
    mounts = mount_aliases.table()
    if not any(point == root or point.startswith(root.rstrip("/") + "/")
               for point in mounts.at for root in writes) \
            and not any(mount_aliases.within("/", root, mounts) != [root] for root in writes):
        return
    for guard in [g for g in items.values() if g.kind == "protected"]:
        for name in mount_aliases.seen(guard.path, writes, mounts):
            if name != guard.path and name not in items:
                _add_everywhere(items, keep, roots, name, guard.is_dir)


def _add_everywhere(items: dict[str, Guard], keep: dict[str, Guard],
                    roots: list[tuple[str, int]], path: str, is_dir: bool) -> None:
    """Protect `path`, and keep the directories above it, in each root it lies below (a root
    itself is an exact grant, which stays writable)."""
    for root, _ in roots:
        if path.startswith(root.rstrip("/") + "/"):
            items[path] = Guard(path, "protected", is_dir)
    _pin_everywhere(keep, roots, path)


def _pin_everywhere(keep: dict[str, Guard], roots: list[tuple[str, int]], path: str) -> None:
    """Keep every directory between each root `path` lies below and `path` (the root itself
    is a mount already; `path` is covered by its own)."""
    for root, _ in roots:
        if path.startswith(root.rstrip("/") + "/"):
            parent = os.path.dirname(os.path.relpath(path, root))
            while parent:
                keep.setdefault(os.path.join(root, parent),
                                Guard(os.path.join(root, parent), "keep", True))
                parent = os.path.dirname(parent)


def find(root: str, root_fd: int, names: frozenset[str],
         guard_git: bool = False, masked: frozenset[str] = frozenset()) -> list[Occurrence]:
    """Every protected occurrence below `root` (whose directory is open as `root_fd`), and with
    `guard_git` every `.git` as a repository. Names match regardless of case: on a case-folding
    filesystem `.GIT` is `.git`."""
    folded = {name.casefold() for name in names}
    found: list[Occurrence] = []
    for dirpath, dirnames, filenames, dir_fd in _walk(root, root_fd):
        # (a masked directory is nothing to the command: not looked into, whatever its mode)
        dirnames[:] = [name for name in dirnames
                       if os.path.normpath(os.path.join(root, dirpath, name)) not in masked]
        if not os.access(".", os.X_OK, dir_fd=dir_fd):  # (listed, but may not be entered)
            if os.fstat(dir_fd).st_uid == os.geteuid():
                raise _hidden_from_walk(root, dirpath, own=True)
            dirnames.clear()  # (another user's: nor may the command enter it)
            continue
        for name in filenames:
            # (a protected name too: it may be another name of a denied file)
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                rel = os.path.normpath(os.path.join(dirpath, name))
                found.append(Occurrence(root, rel, False, linked=True,
                                        inode=(info.st_dev, info.st_ino)))
            elif stat.S_ISSOCK(info.st_mode) and name.casefold() not in folded:
                rel = os.path.normpath(os.path.join(dirpath, name))
                found.append(Occurrence(root, rel, False, socket=True))
        for name in dirnames + filenames:
            whole = name.casefold() in folded
            if not (whole or guard_git and name.casefold() == ".git"):
                continue
            rel = os.path.normpath(os.path.join(dirpath, name))
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                path = os.path.join(root, rel)
                try:
                    target = os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    target = "?"
                raise UnenforceableError(
                    "filesystem.protected" if whole else gitdirs.CAPABILITY,
                    f"protected name {path} is a symbolic link (to {target}; "
                    "perhaps planted by an earlier run), which no mount can keep in place; "
                    f"remove it (rm {path}) or replace it with what it points to",
                )
            if stat.S_ISDIR(mode) and whole:
                found.append(Occurrence(root, rel, True))
                dirnames.remove(name)   # its contents are covered by the read-only mount
            elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                found.append(Occurrence(root, rel, stat.S_ISDIR(mode), repository=not whole))
    return found


def _walk(root: str, root_fd: int, what: str = "write root",
          unlisted: Callable[[str], Exception] | None = None
          ) -> Iterator[tuple[str, list[str], list[str], int]]:
    """What os.fwalk(".", dir_fd=root_fd) yields, top-down (a caller may prune `dirnames`),
    but without recursion and with one directory open at a time: each is opened from the root
    by its path, no symbolic link followed on the way. (os.fwalk recurses and holds a descriptor
    per level: a tree a sandbox made 1500 deep failed every later launch.) A directory that
    vanished or became a link since it was listed is skipped, as os.fwalk skips it. An entry
    whose path reaches PATH_MAX is refused: nothing below it could be covered. With `unlisted`,
    a directory this user may enter but not list raises what `unlisted` makes of its path."""
    prefix = len(os.fsencode(root.rstrip("/") + "/"))
    pending = [""]
    while pending:
        rel = pending.pop()
        try:
            fd = openat2(root_fd, rel or ".", os.O_RDONLY | os.O_DIRECTORY,
                         RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except PermissionError:
            if unlisted is not None and os.access(rel or ".", os.X_OK, dir_fd=root_fd):
                raise unlisted(rel or ".") from None
            own = _own(rel or ".", root_fd)
            if unlisted is None and (own or os.access(rel or ".", os.X_OK, dir_fd=root_fd)):
                raise _hidden_from_walk(root, rel, own) from None
            continue
        except OSError:
            continue
        try:
            dirnames: list[str] = []
            filenames: list[str] = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if prefix + len(os.fsencode(os.path.join(rel, entry.name))) >= PATH_MAX:
                        raise _too_long(root, os.path.join(rel, entry.name), what)
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue  # (gone since it was listed)
                    (dirnames if is_dir else filenames).append(entry.name)
            yield rel or ".", dirnames, filenames, fd
        finally:
            os.close(fd)
        pending.extend(os.path.join(rel, name) for name in reversed(dirnames))


def _own(rel: str, root_fd: int) -> bool:
    try:
        return os.stat(rel, dir_fd=root_fd, follow_symlinks=False).st_uid == os.geteuid()
    except OSError:
        return False


def _hidden_from_walk(root: str, rel: str, own: bool) -> UnenforceableError:
    """A directory in a write root that the walk may not read whole but the command may enter:
    one of this user's (a mode the command may have set: it can set it back in the next run;
    attack 9, dl9f), or another user's it may search but not list (0711, 0733, an ACL: attack
    10, b01/b04). What lies in it (this user's own directories, protected names, other names of
    denied files) cannot be looked for, and the command reaches it by name. One of another
    user's that this user cannot enter is passed over: nor can the command."""
    path = os.path.normpath(os.path.join(root, rel))
    if own:
        return UnenforceableError(
            "filesystem.write", f"{path} in the write root {root} is this user's but cannot "
            "be read whole by it (its mode), so what lies in it (protected names, other names "
            f"of denied files) cannot be looked for; `chmod u+rwx {path}` or remove it")
    return UnenforceableError(
        "filesystem.write", f"{path} in the write root {root} is another user's, which this "
        "user may enter but not list, so what lies in it (this user's own directories, "
        "protected names, other names of denied files) cannot be looked for, and the command "
        f"could reach it by name; have its owner make it listable (chmod o+r {path}) or choose "
        "a write root without it")


def _too_long(root: str, rel: str, what: str) -> UnenforceableError:
    path = os.path.join(root, rel)
    return UnenforceableError(
        "filesystem.write" if what == "write root" else "filesystem.deny",
        f"the {what} {root} holds a path of {len(os.fsencode(path))} bytes "
        f"({path[:len(root) + 60]}...), longer than the kernel's limit of {PATH_MAX - 1}: "
        "what lies there could be neither protected nor masked; remove that tree or make it "
        "shallower")
