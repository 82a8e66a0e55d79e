"""Giving one launch's AppContainer exactly the compiled roots, in order, failing closed:

1. every root is on NTFS or ReFS (`unsupported_filesystem` otherwise);
2. no denied path is open to every AppContainer (ALL APPLICATION PACKAGES): no entry for one
   SID can take that away (`unenforceable:filesystem.deny`);
3. read roots every AppContainer can read already are left alone, and are not walked; so each
   denied file (and file in a denied directory) with several hard links has its names listed
   instead, and any name in such a root, in a standing grant's, or in a directory every
   AppContainer may read refuses the launch (`unenforceable:filesystem.deny`): its one security
   descriptor is the denied file's, and what inherits there (ALL APPLICATION PACKAGES, or the
   standing grant) reaches it whenever Windows propagates that directory;
4. every other root is walked without following reparse points, and any reparse point (but a
   cloud placeholder), or a file with several hard links in a write root, refuses the launch —
   before any access control has changed (a read root inside a write root is walked with it);
   so does any path of it whose DACL this process may not change (a grant is written into
   every file below its root): an interpreter the user does not own, say
   (`unenforceable:filesystem.read` / `.write`, naming the path and what would do instead);
   so does a file in a read root that is, under another name, a denied path or in one (its one
   security descriptor takes the root's grant: `unenforceable:filesystem.deny`);
5. read roots a standing grant may serve (standing.py) are granted once, to a capability of
   their own that each launch reading them holds, and reused while they stand (no walk); a
   root holding a file with a name outside it is the launch's own grant instead;
6. the ACE plan is made; each overridden path is held for the launch's lifetime (an override
   and its revert must not interleave with another launch's on the same path);
7. the steps are applied, each to the file the walk admitted (opened once, refused as
   `path_replaced` if the name now denotes another) and recorded in the ledger before it is
   applied (grants.py).

The filesystem, the DACL store and the locks are arguments: fsinfo.py, aclstore.py and
leases.py on Windows, models in the tests.
"""

from __future__ import annotations

import ntpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stockade.errors import UnavailableError, UnenforceableError
from stockade.launch.hostpaths import upcase
from stockade.launch.request import LaunchRequest
from stockade.windows import aceplan, admission, grants, standing
from stockade.windows.admission import Entry
from stockade.windows.grants import AclStore, Lock, Record
from stockade.windows.standing import StandingGrants


class Filesystem(Protocol):
    def entry(self, path: str) -> Entry: ...

    def scan(self, directory: str) -> list[Entry]: ...

    def filesystem(self, path: str) -> str: ...

    def dacl_writable(self, path: str) -> bool: ...

    def names(self, path: str) -> list[str]: ...


@dataclass(frozen=True)
class Prepared:
    counts: dict[str, int]  # what was done, counted (for `enforced`: no path, no SID)
    capabilities: tuple[str, ...]  # the standing grants' capabilities the launch must hold


def prepare(request: LaunchRequest, sid: str, record: Record, store: AclStore,
            fs: Filesystem, lock: Lock, hold: Callable[[str], None],
            runtime: StandingGrants | None = None, user_sid: str = "") -> Prepared:
    """Apply the plan for `request` to `sid`. With `runtime`, the read roots a standing grant
    may serve are granted once, to a capability of their own (standing.py), not to `sid`."""
    writes = {g.path for g in request.write}
    roots = [g.path for g in request.write] + [g.path for g in request.read
                                               if g.path not in writes]
    for root in roots:
        why = admission.filesystem_refusal(fs.filesystem(root))
        if why:
            raise UnavailableError("unsupported_filesystem", f"{root}: {why}")
    for denied in request.deny:
        if aceplan.exposed(store.read(denied.path)):
            raise UnenforceableError(
                "filesystem.deny", f"{denied.path} is open to every AppContainer (ALL "
                "APPLICATION PACKAGES); Windows cannot take that away from one sandbox")
    covered = frozenset(g.path for g in request.read
                        if g.path not in writes and aceplan.covered(store.read(g.path)))
    denied = [d.path for d in request.deny]
    served, capabilities = [], []
    for root in standing.eligible(request, covered) if runtime else []:
        try:
            capabilities.append(runtime.ensure(
                root, user_sid, store, lock,
                lambda root: _checked(root, fs, "filesystem.read", denied=denied,
                                      lasting=True)))
            served.append(root)
        except standing.NotStanding:
            pass  # granted as the launch's own, below
    covered |= frozenset(served)
    _check_denied_links(request, covered, store, fs)
    tree = {root: _checked(root, fs, "filesystem.write" if root in writes
                           else "filesystem.read", write=root in writes, denied=denied)
            for root in roots if root not in covered}
    steps = aceplan.plan(request, sid, tree, covered)
    # One lease per name as leases.py compares names: two files one name stands for (`.git`
    # and `.GIT` in a case-sensitive directory) share a lease, which this launch takes once.
    for path in {upcase(step.path): step.path for step in steps
                 if step.mode in aceplan.OVERRIDING}.values():
        hold(path)
    walked = {e.path: e.file_id for entries in tree.values() for e in entries}
    grants.apply(steps, sid, store, record, lock, walked)
    overrides = sum(step.mode in aceplan.OVERRIDING for step in steps)
    return Prepared({"grants": len(steps) - overrides, "overrides": overrides,
                     "roots_open_to_every_appcontainer": len(covered) - len(served),
                     "runtime_roots": len(served)}, tuple(capabilities))


def _checked(root: str, fs: Filesystem, capability: str, *, write: bool = False,
             denied: list[str], lasting: bool = False) -> list[Entry]:
    """The walk of `root` (a write root if `write`), admitted, each path's DACL one this user
    may change, no file in it another name of a denied one; for a `lasting` (standing) grant,
    every name of each file in it inside it (standing.NotStanding otherwise)."""
    entries = _admitted(root, fs, write)
    _check_writable(root, entries, fs, capability)
    _check_links(root, entries, fs, denied, lasting)
    return entries


def _check_links(root: str, entries: list[Entry], fs: Filesystem, denied: list[str],
                 lasting: bool) -> None:
    """A file's names share its one security descriptor: the inheritable grant on `root`,
    propagated by name, is written into the file whichever name it arrives by, and the sandbox
    reads the file through its name in the root. So a file in a read root that is also a
    denied path (or lies in one) under another name cannot be denied: refused. (Write roots
    admit no such file at all: admission.entry_refusal.) A standing grant outlives this
    launch's denied paths, so it is made only over a root whose files have no name elsewhere."""
    outside = False
    for entry in entries:
        if entry.is_dir or entry.links < 2:
            continue
        for name in fs.names(entry.path):
            for path in denied:
                if admission.inside(name, path):
                    raise UnenforceableError(
                        "filesystem.deny", f"{entry.path} (in the read root {root}) is a hard "
                        f"link of {name}, which the policy denies ({path}): the file is one, "
                        "readable by either name, so the root gives what the deny takes away. "
                        "Remove the link, or keep the folder holding it out of the roots")
            outside = outside or not admission.inside(name, root)
    if lasting and outside:
        raise standing.NotStanding(root)


DENIED_ENTRIES_LOOKED_AT = 50_000  # in denied directories, at most (as on Linux)


def _check_denied_links(request: LaunchRequest, unwalked: frozenset[str], store: AclStore,
                        fs: Filesystem) -> None:
    """Each denied file, and each file in a denied directory, with more than one name: no
    name may lie in a root not walked for this launch (`unwalked`: open to every AppContainer,
    or a standing grant's), nor, outside every root, in a directory every AppContainer may
    read (C:\\Windows, C:\\Program Files, whatever a policy names or not). The walked roots
    check their own files' names (`_check_links`; write roots admit no multi-link file)."""
    roots = [g.path for g in (*request.read, *request.write)]
    seen = 0
    for denied in request.deny:
        try:
            top = fs.entry(denied.path)
        except FileNotFoundError:
            continue  # (gone: nothing left to read)
        for entry in admission.walk(denied.path, fs.scan, lambda path, top=top: top):
            seen += 1
            if seen > DENIED_ENTRIES_LOOKED_AT:
                raise UnenforceableError(
                    "filesystem.deny", f"the denied paths hold more than "
                    f"{DENIED_ENTRIES_LOOKED_AT} entries (at {denied.path}); Stockade looks "
                    "at that many for hard links and refuses beyond. Deny fewer, smaller "
                    "folders")
            if entry.is_dir or entry.links < 2:
                continue
            for name in fs.names(entry.path):
                where = _readable_by_every_sandbox(name, roots, unwalked, store)
                if where:
                    raise UnenforceableError(
                        "filesystem.deny", f"{entry.path}, which the policy denies "
                        f"({denied.path}), is also {name}, {where}: the file is one, readable "
                        "by either name, and takes what that directory passes on whenever "
                        "Windows propagates it. Remove that link (`fsutil hardlink list "
                        f'"{entry.path}"` lists its names), or keep the secret out of the '
                        "policy's read roots")


def _readable_by_every_sandbox(name: str, roots: list[str], unwalked: frozenset[str],
                               store: AclStore) -> str:
    """Why `name` is in a place every launch (or this one, unwalked) may read; "" if not."""
    for root in unwalked:
        if admission.inside(name, root):
            return f"in the read root {root}, which is not walked (open to every AppContainer " \
                   "or a standing grant)"
    if any(admission.inside(name, root) for root in roots):
        return ""  # a walked root's: its own walk judges it
    folder = ntpath.dirname(name)
    if aceplan.covered(store.read(folder)):
        return f"in {folder}, which every AppContainer may read"
    return ""


def _check_writable(root: str, entries: list[Entry], fs: Filesystem, capability: str) -> None:
    for entry in entries:
        if not fs.dacl_writable(entry.path):
            where = "" if entry.path == root else f" (below the root {root})"
            raise UnenforceableError(
                capability, f"{entry.path}{where}: this user may not change its access control "
                "(WRITE_DAC), which giving the sandbox this root needs. Use a copy this user "
                "owns, or have an administrator give every AppContainer read access to it once "
                "(icacls ROOT /grant *S-1-15-2-1:(OI)(CI)(RX), as C:\\Program Files has): a "
                "root open to every AppContainer needs no change")


def _admitted(root: str, fs: Filesystem, write: bool) -> list[Entry]:
    entries = []
    for entry in admission.walk(root, fs.scan, fs.entry):
        refusal = admission.entry_refusal(entry, write)
        if refusal:
            raise UnenforceableError(*refusal)
        entries.append(entry)
    return entries
