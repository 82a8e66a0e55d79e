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

- **Shields** (`mode = "shield"`): a file with more than one hard link (admitted in read
  roots only: admission.py) has one security descriptor for all its names, so the root's grant,
  propagated by name, would rewrite its inherited entries, seen at its other names outside the
  root (a uv or conda cache), and the revert's propagation would leave it inheriting from the
  root's side, not its own parent's. So it is overridden first: DACL protected, what it
  inherited kept as explicit entries, the launch's read entry explicit on it; propagation stops
  at a protected DACL. The revert writes back its whole DACL as it was, inherited entries and
  control bits included, with nothing derived from a parent: from which of the file's parents
  Windows would derive them is not documented (grants.py).

Shields come first; then grants, outer before inner; overrides after them, outer before inner;
revoking runs in the reverse order (the ledger removes newest first).
"""

from __future__ import annotations

import ntpath
from collections.abc import Mapping
from dataclasses import dataclass

from stockade.errors import SetupError
from stockade.launch.hostpaths import upcase
from stockade.launch.request import LaunchRequest
from stockade.policy.model import protected_whole
from stockade.windows import acl
from stockade.windows import constants as c
from stockade.windows import sid as sids
from stockade.windows.acl import Ace, Dacl
from stockade.windows.admission import Entry, inside

GRANT, OVERRIDE, SHIELD = "grant", "override", "shield"
OVERRIDING = frozenset({OVERRIDE, SHIELD})  # the modes that protect the path's DACL
_CONTENT = 0x1 | 0x2 | 0x4 | c.FILE_EXECUTE | c.DELETE  # read, write, append data; execute


@dataclass(frozen=True)
class Step:
    """After this step, the launch's SID has exactly `aces` as explicit entries on `path`;
    an override or a shield also protects the path's DACL."""

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
    its walk (the root first); `covered_roots` the read roots that need no grant.

    Everything is decided on the walked entries, each known by the file it is (`_Walked`),
    never by a name folded for comparison: two names one comparison makes equal may be two
    files (in a case-sensitive directory `.git` and `.GIT`; anywhere "straße" and "STRASSE"),
    and one closing over the other's override would leave it open. A name in the policy (a
    denied path, a read root, a protected name) stands for every entry Windows could find by
    it without regard to case (`hostpaths.upcase`): more than one only in a case-sensitive
    directory, where each is closed."""
    walked = _Walked(tree)
    writes = [g.path for g in request.write]
    roots = {g.path: root_aces(sid, True, request.exec_from_write) for g in request.write}
    for g in request.read:
        if g.path not in roots and g.path not in covered_roots:
            roots[g.path] = root_aces(sid, False, request.exec_from_write)

    def held(key: str) -> tuple[Ace, ...]:
        """What the launch's SID holds on the file `key` from the grants alone, as explicit
        entries."""
        is_dir = walked.entries[key].is_dir
        out: list[Ace] = []
        for root, aces in roots.items():
            top = walked.top(root)
            if top == key:
                out += aces if is_dir else _strip(acl.inherit(aces, False))
            elif top in walked.above[key]:
                out += _strip(acl.inherit(aces, is_dir))
        return tuple(out)

    hidden = [k for d in request.deny if any(inside(d.path, r) for r in roots)
              for k in walked.named(d.path)]
    readonly = [k for g in request.read
                if any(inside(g.path, w) and upcase(g.path) != upcase(w) for w in writes)
                for k in walked.named(g.path)]
    names = {upcase(name)
             for name in protected_whole(request.protected, request.git, guards_git=False)}
    occurrences = [walked.key(e) for w in writes for e in tree.get(w, ())[1:]
                   if upcase(e.name) in names]
    occurrences = [k for k in occurrences if not walked.within(k, {*hidden, *readonly})]
    readonly += occurrences
    shut = {*hidden, *readonly}
    pinned = [a for k in occurrences for a in walked.between(k, writes)
              if not walked.within(a, shut)]

    kinds = dict.fromkeys(pinned, "pinned") | dict.fromkeys(readonly, "readonly") \
        | dict.fromkeys(hidden, "hidden")
    closed = {k for k, kind in kinds.items() if kind != "pinned"}
    overrides: dict[str, tuple[Ace, ...]] = {}
    for key in sorted(kinds, key=walked.order):
        if walked.above[key] & closed:
            continue  # nothing below a hidden or read-only path needs more
        if kinds[key] == "hidden":
            overrides[key] = ()
        elif kinds[key] == "readonly":
            overrides[key] = tuple(a.with_mask(a.mask & c.FILE_GENERIC_READ_EXECUTE)
                                   for a in held(key))
        else:
            overrides[key] = _pin(held(key))
    grants = [Step(root, GRANT, held(walked.top(root)))
              for root in sorted(roots, key=lambda r: (_depth(r), upcase(r)))
              if walked.top(root) not in overrides]
    # Shields: each file with more than one name (only read roots admit one) is overridden
    # before any grant propagates, so no propagation rewrites the one descriptor its names
    # share (below a hidden path too: that path's override comes after the grant). It gets
    # what the roots give it, nothing below a hidden path.
    hiding = {k for k, kind in kinds.items() if kind == "hidden"}
    shields = [Step(walked.entries[key].path, SHIELD,
                    () if walked.above[key] & hiding else held(key))
               for key in sorted(walked.entries, key=walked.order)
               if walked.entries[key].links > 1 and not walked.entries[key].is_dir
               and key not in overrides]
    return (*shields, *grants, *(Step(walked.entries[key].path, OVERRIDE, aces)
                                 for key, aces in overrides.items()))


class _Walked:
    """The entries of every walk, each under one key for the file it is (its file id), with
    the files above it in any walk; by the name the first walk (the shallowest root) gave it."""

    def __init__(self, tree: Mapping[str, list[Entry]]) -> None:
        self.entries: dict[str, Entry] = {}
        self.above: dict[str, set[str]] = {}
        self._tops: dict[str, str] = {}
        self._named: dict[str, list[str]] = {}
        for root in sorted(tree, key=_depth):
            here: dict[str, str] = {}  # this walk's names, exactly as it gave them
            for entry in tree[root]:
                key = self.key(entry)
                self.entries.setdefault(key, entry)
                parent = here.get(ntpath.dirname(entry.path)) if here else None
                self.above.setdefault(key, set()).update(
                    () if parent is None else {parent, *self.above[parent]})
                here[entry.path] = key
                named = self._named.setdefault(upcase(entry.path), [])
                if key not in named:
                    named.append(key)
            self._tops[root] = self.key(tree[root][0])

    @staticmethod
    def key(entry: Entry) -> str:
        return entry.file_id or "path:" + upcase(entry.path)

    def top(self, root: str) -> str:
        return self._tops[root]

    def named(self, path: str) -> list[str]:
        """The files Windows could find by `path` without regard to case; a path of the policy
        not found in the walk (gone since it was compiled) is refused."""
        found = self._named.get(upcase(path))
        if not found:
            raise SetupError("path_replaced", f"{path} is no longer there (removed or renamed "
                             "since the policy was compiled); nothing was changed",
                             stage="filesystem")
        return found

    def within(self, key: str, closed: set[str]) -> bool:
        """Whether the file `key` is one of `closed` or below one."""
        return key in closed or bool(self.above[key] & closed)

    def between(self, key: str, writes: list[str]) -> set[str]:
        """The directories strictly between the outermost write root holding `key` and it."""
        outer = min((self.top(w) for w in writes
                     if self.top(w) in self.above[key] or self.top(w) == key),
                    key=lambda k: len(self.above[k]))
        return self.above[key] - self.above[outer] - {outer}

    def order(self, key: str) -> tuple[int, str]:
        """Outer before inner."""
        return _depth(self.entries[key].path), upcase(self.entries[key].path)


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


def _depth(path: str) -> int:
    return len(path.rstrip("\\").split("\\"))
