"""Where a place of the host (the home, a state directory, the private homes' directory) is
seen inside a root that holds it under another name (issue 29 B1). A bind mount shows one
directory at a second path (/data/home mounted on /home, a home mounted into a chroot or at
/mnt/alias), and neither a path string nor realpath says so: whether a root holds a place is
decided by identity instead.

The mount table (/proc/self/mountinfo) names what each mount shows by its device and its path
inside that filesystem. A place's path inside its filesystem, found from the mount it lies on,
is shown by every mount of that device whose top lies at or above it, each giving the place a
name; a name inside the root is believed only when lstat finds there what it finds at the
place (for a place not made yet, at its nearest existing ancestor): a name hidden by another
mount, or through a mount that is not recursive, leads elsewhere. No table (not Linux): only
the place's own path counts. One read of the table, string work and a stat per name found in
the root: cheap enough for every launch.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from stockade.errors import UnenforceableError


@dataclass(frozen=True)
class Mount:
    device: str  # "major:minor"
    top: str  # the path inside its filesystem that it shows
    point: str  # where it is mounted
    id: str = ""
    parent: str = ""  # the mount it is mounted on
    layers: tuple[str, ...] = ()  # an overlay's lower and upper directories
    data: tuple[str, ...] = ()  # its data-only lower directories (after "::", `datadir+`)


@dataclass(frozen=True)
class Mounts:
    at: dict[str, Mount]  # by mount point: the one seen there (on top, and not hidden)
    of: dict[str, list[Mount]]  # by device: those seen
    unresolved: tuple[str, ...] = ()  # points the kernel could not be asked about (unopenable)
    by_id: dict[str, Mount] = field(default_factory=dict)  # every one, hidden ones too


def table() -> Mounts:
    """This process's mounts that a path can reach; none where there is no table to read. The
    table lists every mount, stacked and hidden ones too, in an order that says nothing of which
    is on top (a mount put beneath another is listed after it: attack 14; siblings at one point,
    and a mount on "/" over the process's root: attack 15). Where it is not plain — several
    mounts at a point, or one whose parent is not the mount its directory is seen on — the
    kernel is asked which mount the point resolves to (the mount id of a descriptor opened
    there); one it does not resolve to is hidden, judged by nothing."""
    if sys.platform != "linux":  # (no table there: only a place's own path counts)
        return Mounts({}, {})
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            text = f.read()
    except OSError:
        return Mounts({}, {})
    if _last and _last[0] == text:  # (the same table: the same answers; a launch reads it often)
        return _last[1]
    stacked: dict[str, list[Mount]] = {}
    for line in text.splitlines():
        fields = line.split(b" ")
        if len(fields) > 4:
            mount = Mount(os.fsdecode(fields[2]), _unescaped(fields[3]), _unescaped(fields[4]),
                          os.fsdecode(fields[0]), os.fsdecode(fields[1]), *_layers(fields))
            stacked.setdefault(mount.point, []).append(mount)
    at: dict[str, Mount] = {}
    unresolved: list[str] = []
    for point in sorted(stacked, key=len):  # (parents first: a point's directory judged before)
        mounts = stacked[point]
        holder = None if point == "/" else _seen_on(os.path.dirname(point), at)
        if len(mounts) == 1 and (point == "/" or holder is not None
                                 and holder.id == mounts[0].parent):
            at[point] = mounts[0]
            continue
        resolved = _mount_id(point)
        if resolved is None:
            unresolved.append(point)
            continue
        seen = next((m for m in mounts if m.id == resolved), None)
        if seen is not None:
            at[point] = seen
    of: dict[str, list[Mount]] = {}
    for mount in at.values():
        of.setdefault(mount.device, []).append(mount)
    made = Mounts(at, of, tuple(unresolved),
                  {mount.id: mount for listed in stacked.values() for mount in listed})
    # (kept only when the kernel answered for every point: an unopenable one may open later,
    # its mounts unchanged, the table's text too; attack 17, S1)
    _last[:] = [] if unresolved else [text, made]
    return made


_last: list = []  # (the table last read, and what was made of it)


def _layers(fields: list[bytes]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An overlay's lower and upper directories, and its data-only lower ones (after "::" in
    `lowerdir`, or `datadir+`), as its mounter wrote them, from its line's options (after " -
    overlay SOURCE"): its files are theirs, on a device of its own, which no other name is
    compared with (attacks 18, 19). The table writes a blank, a comma or a backslash of a value
    as an octal escape, decoded here; a backslash left is overlay's own escape (`\\:`,
    `\\,`, or any other, which overlay drops), so a value holding one is kept whole as
    written, a layer no path is compared with (`plain` says no; attack 21); the rest are split
    as overlay splits them (a `lowerdir+`/`datadir+` value is one path)."""
    try:
        at = fields.index(b"-", 6)
    except ValueError:
        return (), ()
    if fields[at + 1:at + 2] != [b"overlay"] or len(fields) < at + 4:
        return (), ()
    layers: list[str] = []
    data: list[str] = []
    for option in fields[at + 3].split(b","):
        key, _, raw = option.partition(b"=")
        value = _unescaped(raw)
        if key not in (b"lowerdir", b"upperdir", b"lowerdir+", b"datadir+") or not value:
            continue
        if "\\" in value:
            layers.append(value)
        elif key == b"lowerdir":
            normal, _, only_data = value.partition("::")
            layers += [part for part in normal.split(":") if part]
            data += [part for part in only_data.split(":") if part]
        else:
            (data if key == b"datadir+" else layers).append(value)
    return tuple(layers), tuple(data)


def plain(layer: str) -> bool:
    """Whether an overlay's layer, as _layers gives it, is a path to compare: absolute,
    normal, and written without escapes."""
    return (os.path.isabs(layer) and os.path.normpath(layer) in (layer, layer.rstrip("/"))
            and "\\" not in layer)


def covered(mount: Mount, mounts: Mounts) -> list[tuple[str, str]]:
    """What the point of `mount`, which hides it, may have named before `mount` was mounted
    there, as (device, path inside that filesystem): through each mount it covers there
    (stacked, in an order the table does not tell: attack 25, C7), and the one its point lies
    on."""
    found = []
    under = mounts.by_id.get(mount.parent)
    while under is not None and under.id != mount.id:
        found.append(under)
        if under.point != mount.point:
            break
        under = mounts.by_id.get(under.parent)
    return [(m.device, os.path.normpath(os.path.join(m.top, _below(mount.point, m.point))))
            for m in found if at_or_below(mount.point, m.point)]


def beneath(mount: Mount, mounts: Mounts) -> list[str]:
    """The names other mounts give what lies beneath `mount` at its point (`covered`) that
    show it: a bind that is not recursive shows what a mount hides (attack 23, A5: an overlay
    on its own layer, its filesystem bound elsewhere)."""
    names = []
    for device, inner in covered(mount, mounts):
        for m in mounts.of.get(device, []):
            if not at_or_below(inner, m.top):
                continue
            name = os.path.normpath(os.path.join(m.point, _below(inner, m.top)))
            if not at_or_below(name, mount.point) and _seen_on(name, mounts.at) is m:
                names.append(name)
    return names


def mount_of(path: str, mounts: Mounts) -> Mount | None:
    """The mount the absolute, resolved `path` lies on, as the table tells."""
    return _seen_on(path, mounts.at)


def _seen_on(path: str, at: dict[str, Mount]) -> Mount | None:
    """The mount `path` is seen on: that of the deepest seen mount point at or above it."""
    while path not in at:
        if path == "/":
            return None
        path = os.path.dirname(path)
    return at[path]


def _mount_id(point: str) -> str | None:
    """The id of the mount `point` resolves to, as the kernel says (fdinfo's mnt_id), or None
    where it cannot be opened."""
    try:
        fd = os.open(point, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return line.split()[1]
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def _unescaped(field: bytes) -> str:
    """A path of the table: space, tab, newline and backslash are written as octal escapes."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), field))


def within(root: str, place: str, mounts: Mounts) -> list[str]:
    """Every path at which `place` is seen at or below `root` (both absolute and normalised;
    a symbolic link on `place`'s path is not followed: a caller that walks links asks again
    for each target): `place` itself if `root` holds it by path, and each other name the
    `mounts` (table()) give it there."""
    found = [place] if at_or_below(place, root) else []
    for name in _names(place, mounts):
        if name != place and at_or_below(name, root) and _same(name, place):
            found.append(name)
    return found


def seen(place: str, roots: list[str], mounts: Mounts) -> list[str]:
    """Every path at or below one of `roots` at which `place` is seen (within(), for several
    roots at once) and each mount point there that shows a part of it (a key file of a
    denied directory bound into a root), believed when lstat finds there what it finds at
    that part's path below `place`."""
    def held(path: str) -> bool:
        return any(at_or_below(path, root) for root in roots)

    found = [place] if held(place) else []
    for device, inner in inside(place, mounts):
        for m in mounts.of[device]:
            if at_or_below(inner, m.top):
                name = os.path.normpath(os.path.join(m.point, _below(inner, m.top)))
                if name != place and held(name) and _same(name, place):
                    found.append(name)
            elif at_or_below(m.top, inner) and held(m.point) \
                    and _identical(m.point, os.path.join(place, _below(m.top, inner))):
                found.append(m.point)
    return found


def shown(place: str, roots: list[str], mounts: Mounts) -> list[str]:
    """The other paths at or below one of `roots` at which the mount table says `place`, or a
    part of it, is shown, none compared with `place` (which this user cannot look up: below a
    directory of another user's it may not search) and each existing."""
    def held(path: str) -> bool:
        return any(at_or_below(path, root) for root in roots)

    found: list[str] = []
    for device, inner in inside(place, mounts):
        for m in mounts.of[device]:
            if at_or_below(inner, m.top):
                name = os.path.normpath(os.path.join(m.point, _below(inner, m.top)))
            elif at_or_below(m.top, inner):
                name = m.point
            else:
                continue
            if name != place and held(name) and os.path.lexists(name):
                found.append(name)
    return found


def _identical(name: str, path: str) -> bool:
    try:
        here = os.lstat(path)
    except OSError:
        return False
    there = look(name)
    return there is not None and os.path.samestat(here, there)


def look(path: str) -> os.stat_result | None:
    """lstat(`path`): None where nothing is there, or where the command cannot reach it either
    (below a directory of another user's this user may not search); refused, typed, where this
    user cannot look at it and the command might reach it (below a directory of its own it may
    not search, which it can chmod; past PATH_MAX, which it can walk a directory at a time): a
    name that cannot be compared must never pass for another thing's (attacks 16, 17)."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        try:  # (realpath too may not look: another user's /proc/PID/root; attack 27 P5)
            if os.lstat(os.path.realpath(first_unsearchable(path))).st_uid != os.geteuid():
                return None
        except OSError:
            pass
        raise _unlooked(path, exc) from None
    except OSError as exc:
        raise _unlooked(path, exc) from None


def _unlooked(path: str, exc: OSError) -> UnenforceableError:
    shown = path if len(path) <= 200 else f"{path[:100]}...{path[-80:]}"
    return UnenforceableError("filesystem.read", (
        f"{shown}, where a mount shows part of a root, cannot be looked at by this user "
        f"({exc.strerror}), so what it shows cannot be compared with the denied and protected "
        "paths; make the directories above it searchable by this user, or choose roots that "
        "do not hold it"))


def first_unsearchable(path: str) -> str:
    """The first directory on the way to `path` that this user may not search (its parent if
    none is: one may be a moment later)."""
    above = os.path.dirname(path)
    at = "/"
    for part in above.strip("/").split("/"):
        at = os.path.join(at, part)
        if not os.access(at, os.X_OK):
            return at
    return above


def inside(place: str, mounts: Mounts) -> list[tuple[str, str]]:
    """`place`'s filesystem and path inside it, as (device, path), from the mount it is seen
    on (none if no mount holds it)."""
    point = place
    while point not in mounts.at:
        if point == "/":
            return []
        point = os.path.dirname(point)
    mount = mounts.at[point]
    return [(mount.device,
             os.path.normpath(os.path.join(mount.top, _below(place, mount.point))))]


def _names(place: str, mounts: Mounts) -> list[str]:
    """`place`'s path under each mount of its filesystem that shows it."""
    return [os.path.normpath(os.path.join(m.point, _below(inner, m.top)))
            for device, inner in inside(place, mounts)
            for m in mounts.of[device] if at_or_below(inner, m.top)]


def _same(name: str, place: str) -> bool:
    """Whether `name` leads where `place` does: the same inode at the place, or at its nearest
    existing ancestor and the ancestor of `name` as far above it."""
    while True:
        try:
            here = os.lstat(place)
        except (FileNotFoundError, NotADirectoryError):
            if place == "/":
                return False
            place, name = os.path.dirname(place), os.path.dirname(name)
            continue
        except OSError:
            return False
        there = look(name)
        return there is not None and os.path.samestat(here, there)


def at_or_below(path: str, top: str) -> bool:
    """Whether the path `path` is `top` or lies below it (as strings)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def _below(path: str, top: str) -> str:
    """`path` relative to `top`, which holds it ("" for `top` itself)."""
    return path[len(top.rstrip("/")):].lstrip("/")
