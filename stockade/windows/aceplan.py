"""The ACE plan: which access-control entries a launch's package SID gets, on which paths.

Windows matches a package SID against *allow* entries only: a deny entry naming an AppContainer
SID is ignored when that AppContainer asks for access. So nothing here denies; narrowing is done
by *overriding* what a path inherits ("mask reduction").

- **Grants** (`mode = "grant"`): an explicit, inheritable entry on each root — read roots
  read+execute; write roots modify (read, write, execute, delete; never FILE_DELETE_CHILD, so a
  name can only be removed by someone allowed to delete that very object). With
  `exec_from_write = false` a write root gets two entries instead: directories keep modify
  (traverse is the execute bit of a directory), files get modify without FILE_EXECUTE, so no
  file in a write root can be mapped as an image. Read roots that every AppContainer can already
  read (ALL APPLICATION PACKAGES, as for C:\\Windows and C:\\Program Files) get no grant at all.
- **Overrides** (`mode = "override"`): the path's DACL is protected (inheritance from its parent
  blocked), what it inherited is kept as explicit entries for every other trustee, and the
  launch's own entries are replaced by:
  - `hidden`: nothing — a denied path inside a granted root;
  - `readonly`: the same entries with only read and execute rights — each occurrence of a
    protected name inside a write root, and each read root inside a write root;
  - `pinned`: the same rights without DELETE on the directory itself (its contents unchanged) —
    every directory between the outermost write root and a protected occurrence, so none can be
    renamed away and replaced by a look-alike.
  Precedence: hidden over readonly over pinned. Paths inside a hidden or readonly path need
  nothing more.

Grants come first, outer before inner; overrides after them, outer before inner; revoking runs
in the reverse order (the ledger removes newest first).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stockade.launch.request import LaunchRequest
from stockade.policy.model import protected_whole
from stockade.windows import acl
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace, Dacl
from stockade.windows.admission import Entry, inside

GRANT, OVERRIDE = "grant", "override"
_CONTENT = 0x1 | 0x2 | 0x4 | c.FILE_EXECUTE | c.DELETE  # read, write, append data; execute


@dataclass(frozen=True)
class Step:
    """After this step, the launch's SID has exactly `aces` as explicit entries on `path`;
    an override also protects the path's DACL."""

    path: str
    mode: str
    aces: tuple[Ace, ...]


def root_aces(sid: str, write: bool, exec_from_write: bool) -> tuple[Ace, ...]:
    both = acl.OBJECT_INHERIT | acl.CONTAINER_INHERIT
    if not write:
        return (Ace.allow(sid, c.FILE_GENERIC_READ_EXECUTE, both),)
    if exec_from_write:
        return (Ace.allow(sid, c.FILE_MODIFY, both),)
    return (Ace.allow(sid, c.FILE_MODIFY, acl.CONTAINER_INHERIT),
            Ace.allow(sid, c.FILE_MODIFY & ~c.FILE_EXECUTE,
                      acl.OBJECT_INHERIT | acl.INHERIT_ONLY))


def covered(dacl: Dacl) -> bool:
    """Whether every AppContainer may already read and execute the tree at this DACL: ALL
    APPLICATION PACKAGES holds read+execute on the object itself, and passes it on to every
    file and directory below. The entries may be split, as stock Windows writes them for
    C:\\Windows and C:\\Program Files — `(RX)` effective without inheritance, and
    `(OI)(CI)(IO)(GR,GE)` inherit-only with generic rights — so the rights are summed per use,
    generic rights mapped to file rights."""
    here = files = directories = 0
    for a in dacl.aces:
        if a.type != acl.ALLOW or a.sid != sids.ALL_APP_PACKAGES:
            continue
        mask = acl.mapped(a.mask)
        if a.effective:
            here |= mask
        if not a.flags & acl.NO_PROPAGATE:
            files |= mask if a.flags & acl.OBJECT_INHERIT else 0
            directories |= mask if a.flags & acl.CONTAINER_INHERIT else 0
    rx = c.FILE_GENERIC_READ_EXECUTE
    return all(mask & rx == rx for mask in (here, files, directories))


def exposed(dacl: Dacl) -> bool:
    """Whether every AppContainer may reach the content at this DACL (no override can take
    that away from one AppContainer alone)."""
    return any(acl.allowed(dacl.aces, every) & _CONTENT
               for every in (sids.ALL_APP_PACKAGES, sids.ALL_RESTRICTED_APP_PACKAGES))


def plan(request: LaunchRequest, sid: str, tree: Mapping[str, list[Entry]],
         covered_roots: frozenset[str]) -> tuple[Step, ...]:
    """The steps for `request`. `tree` holds, for each root that gets a grant, the entries of
    its walk (the root first); `covered_roots` the read roots that need no grant."""
    entries = {e.path.casefold(): e for walked in tree.values() for e in walked}
    writes = [g.path for g in request.write]
    roots = {g.path: root_aces(sid, True, request.exec_from_write) for g in request.write}
    for g in request.read:
        if g.path not in roots and g.path not in covered_roots:
            roots[g.path] = root_aces(sid, False, request.exec_from_write)

    def held(path: str) -> tuple[Ace, ...]:
        """What the launch's SID holds on `path` from the grants alone, as explicit entries."""
        is_dir = entries[path.casefold()].is_dir
        out: list[Ace] = []
        for root, aces in roots.items():
            if root.casefold() == path.casefold():
                out += aces if is_dir else _strip(acl.inherit(aces, False))
            elif inside(path, root):
                out += _strip(acl.inherit(aces, is_dir))
        return tuple(out)

    hidden = [d.path for d in request.deny if any(inside(d.path, r) for r in roots)]
    readonly = [g.path for g in request.read
                if any(inside(g.path, w) and g.path.casefold() != w.casefold() for w in writes)]
    names = {name.casefold()
             for name in protected_whole(request.protected, request.git, guards_git=False)}
    occurrences = [e.path for w in writes for e in tree.get(w, ())[1:]
                   if e.name.casefold() in names]
    occurrences = [p for p in occurrences if not any(inside(p, q) for q in hidden + readonly)]
    readonly += occurrences
    pinned = [a for p in occurrences for a in _between(p, writes)
              if not any(inside(a, q) for q in hidden + readonly)]

    kinds = {p.casefold(): (p, "pinned") for p in pinned}
    kinds |= {p.casefold(): (p, "readonly") for p in readonly}
    kinds |= {p.casefold(): (p, "hidden") for p in hidden}
    closed = [p for p, kind in kinds.values() if kind != "pinned"]
    overrides: dict[str, tuple[Ace, ...]] = {}
    for path, kind in sorted(kinds.values(), key=lambda pk: (_depth(pk[0]), pk[0].casefold())):
        if any(inside(path, q) and path.casefold() != q.casefold() for q in closed):
            continue  # nothing below a hidden or read-only path needs more
        if kind == "hidden":
            overrides[path] = ()
        elif kind == "readonly":
            overrides[path] = tuple(a.with_mask(a.mask & c.FILE_GENERIC_READ_EXECUTE)
                                    for a in held(path))
        else:
            overrides[path] = _pin(held(path))
    overridden = {path.casefold() for path in overrides}
    grants = [Step(root, GRANT, held(root))
              for root in sorted(roots, key=lambda r: (_depth(r), r.casefold()))
              if root.casefold() not in overridden]
    return (*grants, *(Step(path, OVERRIDE, aces) for path, aces in overrides.items()))


def _strip(aces: tuple[Ace, ...]) -> tuple[Ace, ...]:
    return tuple(a.with_flags(a.flags & ~acl.INHERITED) for a in aces)


def _pin(aces: tuple[Ace, ...]) -> tuple[Ace, ...]:
    out = []
    for ace in aces:
        if not ace.effective:
            out.append(ace)
            continue
        out.append(ace.with_flags(0).with_mask(ace.mask & ~c.DELETE))
        if ace.flags & (acl.OBJECT_INHERIT | acl.CONTAINER_INHERIT):
            out.append(ace.with_flags(ace.flags | acl.INHERIT_ONLY))
    return tuple(out)


def _between(path: str, writes: list[str]) -> list[str]:
    """The directories strictly between the outermost write root holding `path` and `path`."""
    outer = min((w for w in writes if inside(path, w)), key=_depth)
    parts = path.split("\\")
    return ["\\".join(parts[:n]) for n in range(_depth(outer) + 1, len(parts))]


def _depth(path: str) -> int:
    return len(path.rstrip("\\").split("\\"))
