"""Overlays in the launch's view, judged against the denied paths (issue 29, attacks 18-26).

An overlay's files are its layers' on a device of its own: no name of them there is compared
with the denied paths, and none is masked. So each launch runs two checks (compile.py):

- `refuse_overlays_of_denied` (forward): an overlay in or above a root may not show a denied
  path under another name through one of its layers;
- `refuse_layer_copies` (reverse): a denied path, or one of Stockade's state places, that lies
  on an overlay may not have a layer that a root reaches (holds, lies in, shows through a bind,
  shares with an overlay in a root, or shows beneath the overlay's point).

The mount table gives each layer as its mounter wrote it, where it stood then. A layer is
judged by what it is (a link followed, a bind known by its identity), through overlays stacked
as deep as the kernel stacks them. One that cannot be judged refuses the launch: written
relative, with `..` or with escapes (except in the overlay the process's own root is: a
container's engine's store), or named below the overlay's own point, which hides that name.
What this does not cover (layers re-pointed after mounting, data-only layers, a layer given by
a descriptor) is listed in SECURITY.md, "Not protected".
"""

from __future__ import annotations

import os

from stockade.errors import UnenforceableError
from stockade.launch.hostpaths import holding_root, inside, meeting_root
from stockade.launch.request import PathGrant
from stockade.lifecycle import aliases

OVERLAY_DEPTH = 2  # overlays on overlays: the kernel stacks no deeper (FILESYSTEM_MAX_STACK_DEPTH)


def refuse_overlays_of_denied(read: tuple[PathGrant, ...], write: tuple[PathGrant, ...],
                              deny: tuple[PathGrant, ...]) -> None:
    """Refuse, typed, a root that holds, or lies in, an overlay that may show a denied path
    under another name (attacks 18-21, 25, 26). Passed over: an overlay out of this user's
    reach, and one at or below a denied path (masked whole: the knob that lets a root hold
    such an overlay)."""
    mounts = aliases.table()
    own_root = mounts.at.get("/")
    for point, mount in mounts.at.items():
        held = mount.layers and meeting_root(point, read + write)
        if not held or any(inside(point, grant.path) for grant in deny) \
                or aliases.look(point) is None:
            continue
        why = _overlay_unjudged(point, mount, deny, mounts, own_root)
        if why:
            within = holding_root(point, read + write) is not None and point != held
            raise UnenforceableError("filesystem.deny", (
                f"{point}, an overlay in or above the root {held}, {why}; unmount it (umount "
                f"{point}){', deny it (filesystem.deny)' if within else ''} or choose roots "
                "that do not hold it"))


def _overlay_unjudged(point: str, mount: aliases.Mount, deny: tuple[PathGrant, ...],
                      mounts: aliases.Mounts, own_root: aliases.Mount | None,
                      depth: int = 0) -> str:
    """Why the overlay `mount` at `point` may show a denied path under another name, or ""."""
    container = own_root is not None and mount.id == own_root.id
    for layer in mount.layers + mount.data:
        why = _unjudgeable(layer, point, container)
        if why is None:
            continue
        if why:
            return f"has a layer {why}"
        if aliases.look(layer) is None:
            continue  # (outside this view, as WSL's and systemd-sysext's layers are, or below
            # another user's directory: composefs's; see SECURITY.md, "Not protected", for one
            # mounted from a chroot)
        denied = _overlaid(point, layer, deny, mounts)
        if denied is not None:
            return (f"shows the denied path {denied} through its layer {layer}, on a device of "
                    "its own, where no mask follows it")
        real = os.path.realpath(layer)
        under = aliases.mount_of(real, mounts)
        if under is not None and under.id == mount.id:  # (its own point: what it covers there)
            hidden = _hidden_layer(real, point, container)
            if hidden:
                return f"has a layer {layer} {hidden}"
            denied = _covered_denied(point, mount, deny, mounts)
            if denied is not None:
                return (f"shows the denied path {denied} through its layer {layer}, which it "
                        "covers, where no mask follows it")
            continue
        if under is None or not under.layers:
            continue  # (not on an overlay)
        if depth >= OVERLAY_DEPTH:
            return f"has a layer {layer} on overlays stacked deeper than the kernel stacks"
        why = _overlay_unjudged(under.point, under, deny, mounts, own_root, depth + 1)
        if why:
            return f"has a layer {layer} on the overlay at {under.point}, which {why}"
    return ""


def refuse_layer_copies(places: list[str], roots: tuple[PathGrant, ...],
                        deny: tuple[PathGrant, ...]) -> None:
    """Refuse, typed, a denied path (or one of Stockade's state places: `places`) that lies on
    an overlay one of whose layers (or a layer of an overlay that one lies on) a root holds,
    lies in, shows through a bind, or shares with an overlay in a root: the layer holds its
    files under other names no name of the overlay tells — its lower copy, a copy renamed
    since (a redirect, a metacopy), one deleted from the overlay (a whiteout hides it there
    only), an upper layer the command could write (attacks 21 R1, 22-24). A layer denied too
    is masked whole; one not found here, or out of this user's reach, is outside this view;
    one that is the overlay's own point (as over /etc) has no other name unless a bind shows
    what lies beneath; a data-only layer (a store: NixOS's /etc) holds data, not names."""
    masked = [grant.path for grant in deny] + places
    _refuse_copies(list(dict.fromkeys(places + [grant.path for grant in deny])), roots, masked,
                   "filesystem.deny", "the denied path")


def refuse_host_code_copies(places: list[str], write: tuple[PathGrant, ...],
                            deny: tuple[PathGrant, ...]) -> None:
    """Refuse, typed, a place of the code the host runs next (hostcode.py) that lies on an
    overlay whose layer a write root reaches: the command writes that layer, and the host runs
    what it wrote (attack 27 H2)."""
    _refuse_copies(places, write, [grant.path for grant in deny], "filesystem.host_code",
                   "the host's code at")


def _refuse_copies(places: list[str], roots: tuple[PathGrant, ...], masked: list[str],
                   key: str, what: str) -> None:
    mounts = aliases.table()
    if not any(mount.layers for mount in mounts.at.values()):
        return  # (no overlay: nothing here holds a copy)
    own_root = mounts.at.get("/")
    shown = _shown_layers(mounts, roots)
    for place in places:
        why, overlay = _layer_held(place, roots, masked, mounts, own_root, shown)
        if why:
            # (denying a layer an overlay in a root shows makes that overlay show a denied path)
            remedy = "choose roots that do not hold it" if meeting_root(overlay, roots) else \
                "deny that layer too (filesystem.deny), or choose roots that do not hold it"
            raise UnenforceableError(key, (
                f"{what} {place} lies on an overlay {why}, which holds its files under other "
                f"names; {remedy}"))


def _layer_held(path: str, roots: tuple[PathGrant, ...], masked: list[str],
                mounts: aliases.Mounts, own_root: aliases.Mount | None,
                shown: list[tuple[aliases.Mount, str, os.stat_result]], depth: int = 0
                ) -> tuple[str, str]:
    """Which layer of the overlay `path` lies on a root can reach, and that overlay's point;
    ("", "") if none."""
    on = aliases.mount_of(path, mounts)
    if on is None or not on.layers:
        return "", ""
    container = own_root is not None and on.id == own_root.id
    for layer in on.layers:
        why = _unjudgeable(layer, on.point, container)
        if why is None:
            continue
        if why:
            return f"(at {on.point}) whose layer {why}", on.point
        real = os.path.realpath(layer)
        if aliases.look(real) is None or any(inside(real, place) for place in masked):
            continue  # (outside this view or out of reach; or masked whole)
        under = aliases.mount_of(real, mounts)
        if under is not None and under.id == on.id:  # (beneath its own point: hidden by it)
            hidden = _hidden_layer(real, on.point, container)
            if hidden:
                return f"(at {on.point}) whose layer {layer} {hidden}", on.point
            names = [name for name in aliases.beneath(on, mounts)
                     if meeting_root(name, roots) is not None]
            if names:
                return (f"(at {on.point}) whose layer {layer}, beneath it, a root shows at "
                        f"{names[0]}", on.point)
            continue
        held = meeting_root(real, roots)
        if held is not None:
            return (f"(at {on.point}) whose layer {layer} the root {held} holds or lies in",
                    on.point)
        seen = aliases.seen(real, [root.path for root in roots], mounts)
        if seen:  # (a bind mount shows the layer, or a part of it, in a root)
            return f"(at {on.point}) whose layer {layer} a root shows at {seen[0]}", on.point
        other = next((mount.point for mount, shared, info in shown if mount.id != on.id
                      and _overlapping(real, shared, info)), None)
        if other is not None:
            return (f"(at {on.point}) whose layer {layer} the overlay at {other}, in a root, "
                    "has too", on.point)
        if depth < OVERLAY_DEPTH:
            why, _ = _layer_held(real, roots, masked, mounts, own_root, shown, depth + 1)
            if why:
                return f"(at {on.point}) whose layer {layer} lies on an overlay {why}", on.point
    return "", ""


def _unjudgeable(layer: str, point: str, container: bool) -> str | None:
    """Why a layer of the overlay at `point` cannot be judged where it is ("" if it can), or
    None to pass it over. One written relative, with `..` or with escapes cannot be found
    (attacks 20, 21); one below the overlay's own point is hidden by it (`_hidden_layer`). The
    overlay the process's own root is (a container's: `container`) has its engine's store for
    layers, written relative to it, outside its view and the command's: passed over. One named
    through /proc (a descriptor of the mounter's, another process's root: attack 27 P5, P6)
    names here what this process sees there, not what the mounter saw."""
    if not aliases.plain(layer):
        return None if container else f"{layer!r}, written so that where it lies cannot be told"
    if aliases.at_or_below(layer, "/proc"):
        return (f"{layer}, named through /proc (what one process saw: its descriptor, its "
                "root), so what it named cannot be told")
    hidden = _hidden_layer(layer, point, container)
    return f"{layer} {hidden}" if hidden else ""


def _hidden_layer(layer: str, point: str, container: bool) -> str:
    """Why a layer below its overlay's own point cannot be judged, or "": the overlay hides
    that name, so what it named when mounted (a link, a bind: attacks 25, 26) cannot be looked
    up. A layer that is the point itself is judged by what the overlay covers there; the
    process's own root overlay's layers are outside its view."""
    name = os.path.normpath(layer)
    if container or name == point or not aliases.at_or_below(name, point):
        return ""
    return "below its own point, which it hides: what that name named cannot be told"


def _shown_layers(mounts: aliases.Mounts, roots: tuple[PathGrant, ...]
                  ) -> list[tuple[aliases.Mount, str, os.stat_result]]:
    """The layers the roots show through overlays (each with its overlay and its identity):
    those of each overlay in or above a root, and of the overlays those layers lie on."""
    found = []
    pending = [(mount, 0) for point, mount in mounts.at.items()
               if mount.layers and meeting_root(point, roots)]
    while pending:
        mount, depth = pending.pop()
        for layer in mount.layers + mount.data:
            real = os.path.realpath(layer)
            try:
                info = os.stat(real)
            except OSError:
                continue  # (not here, out of reach, or unplain: judged as the overlay is)
            found.append((mount, real, info))
            under = aliases.mount_of(real, mounts)
            if depth < OVERLAY_DEPTH and under is not None and under.layers \
                    and under.id != mount.id:
                pending.append((under, depth + 1))
    return found


def _overlapping(path: str, other: str, other_is: os.stat_result) -> bool:
    """Whether the directories `path` and `other` are one, or one lies in the other, by
    identity (a bind mount gives a directory a second name: attack 24)."""
    try:
        path_is = os.stat(path)
    except OSError:
        return False
    return any(_same_as(above, other_is) for above in _ancestors(path)) \
        or any(_same_as(above, path_is) for above in _ancestors(other))


def _ancestors(path: str) -> list[str]:
    found = [path]
    while found[-1] != "/":
        found.append(os.path.dirname(found[-1]))
    return found


def _covered_denied(point: str, mount: aliases.Mount, deny: tuple[PathGrant, ...],
                    mounts: aliases.Mounts) -> str | None:
    """The denied path the overlay `mount` gives another name through the layer that is its
    own point: what it covers there (aliases.covered), judged by filesystem and path inside
    it (attack 25, C1, C5, C6: a bind of a denied directory, the overlay mounted over it on
    its own layer)."""
    held = aliases.covered(mount, mounts)
    for grant in deny:
        for device, denied_inner in aliases.inside(grant.path, mounts):
            for layer_device, inner in held:
                if layer_device != device:
                    continue
                if aliases.at_or_below(denied_inner, inner):
                    name = os.path.normpath(os.path.join(point, os.path.relpath(denied_inner,
                                                                               inner)))
                    if name != grant.path:
                        return grant.path
                elif aliases.at_or_below(inner, denied_inner) and not inside(point, grant.path):
                    return grant.path
    return None


def _overlaid(point: str, layer: str, deny: tuple[PathGrant, ...],
              mounts: aliases.Mounts) -> str | None:
    """The denied path the overlay at `point` gives another name through `layer`: one at or
    below a directory the layer is (by identity), or one the layer lies in, by its path or by
    the filesystem and path inside it that the mount it lies on shows (a bind of a directory
    inside the denied one: attack 27 P8; an overlay mounted on its own layer, as over /etc,
    gives the denied paths no other name)."""
    try:
        layer_is = os.stat(layer)
    except OSError:
        return None
    real = os.path.realpath(layer)
    layer_inside = aliases.inside(real, mounts)
    for grant in deny:
        above = grant.path
        while True:
            if _same_as(above, layer_is):
                name = os.path.normpath(os.path.join(point, os.path.relpath(grant.path, above)))
                if name != grant.path:
                    return grant.path
                break
            if above == "/":
                break
            above = os.path.dirname(above)
        try:
            denied_is = os.stat(grant.path)
        except OSError:
            continue
        part = real
        while part != "/" and not _same_as(part, denied_is):
            part = os.path.dirname(part)
        if part != "/" and not inside(point, grant.path):
            return grant.path
        if not inside(point, grant.path) and any(
                device == denied_device and aliases.at_or_below(inner, denied_inner)
                for device, inner in layer_inside
                for denied_device, denied_inner in aliases.inside(grant.path, mounts)):
            return grant.path
    return None


def _same_as(path: str, info: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(path), info)
    except OSError:
        return False
