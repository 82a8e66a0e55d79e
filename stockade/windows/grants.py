"""Applying the ACE plan's steps and reverting them exactly, with the ledger in between.

For each step, under a per-path lock, the path is opened once (never through a reparse point)
and everything below concerns that one file, whatever its name denotes meanwhile: it must be the
file the walk admitted (`path_replaced` otherwise, before anything changes on it); its DACL is
read; a ledger record is written holding the launch SID, the mode, every explicit entry as it
was (`prior`), whether the DACL was protected, and which file it is (`file_id`); only then is its
DACL changed. Entries are handled as bytes, so what is restored is what was there, byte for byte.

Reverting (`revert`, the ledger's remover for these records, also after a crash):

- a grant: the SID's explicit entries are removed and any it held before are put back at their
  old places; everything else on the DACL, including changes made meanwhile, is kept;
- an override: the explicit entries and the protection flag become exactly what they were;
- a shield (a file with several hard links, aceplan.py): its whole DACL is written back as it
  was — every entry, the inherited ones too, in order, and its control bits — verbatim, with
  nothing derived from a parent (`Opened.restore`: SetKernelObjectSecurity). Unprotecting it
  would have Windows derive its inherited entries again, from one of its names' parents —
  which one, for a file with several, is not documented: perhaps the root's side.

Either is idempotent, and refused (the record is kept for an operator) when the path now denotes
another file than the one changed; the file compared is the one opened, and changed through that
handle. Writing a directory's DACL makes Windows propagate its inheritable entries to everything
below it, by name; a junction (or other reparse point) the sandbox made below it during the run
could lead that propagation to another tree, whose files would then get their inherited entries
from the wrong parent. So while a revert writes, every reparse point below the path carries no
reparse data (`without_reparse_points`), and each gets it back after; one that cannot be set aside
(or is not a junction, whose data could not safely be put back) refuses the revert (the record is
kept, and reconciling tries again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from stockade.errors import SetupError
from stockade.lifecycle.removers import RemovalError
from stockade.windows.aceplan import GRANT, OVERRIDE, SHIELD, Step
from stockade.windows.acl import INHERITED, Ace, Dacl

KIND = "winacl"  # the ledger kind of these records
DETAIL_KEYS = frozenset({"sid", "mode", "prior", "protected", "file_id"})
# A shield's record holds its whole DACL as `prior` (inherited entries too) and its control bits.
SHIELD_KEYS = DETAIL_KEYS | {"control"}


class Opened(Protocol):
    """One file, opened once: what is read, identified and written is that file."""

    def read(self) -> Dacl: ...

    def write(self, explicit: tuple[Ace, ...], protected: bool) -> None:
        """Set the explicit entries and protection; the store derives the inherited ones."""

    def identity(self) -> str: ...

    def restore(self, dacl: Dacl) -> None:
        """Write `dacl` verbatim — its entries, inherited ones too, and its control bits —
        deriving nothing from a parent and propagating nothing."""


class AclStore(Protocol):
    """Where DACLs live: the filesystem on Windows (aclstore.py), a model in tests."""

    def read(self, path: str) -> Dacl:
        """The DACL `path` denotes now: for judging it, never for changing it."""

    def opened(self, path: str) -> AbstractContextManager[Opened]:
        """The file `path` denotes, opened (not through a reparse point); FileNotFoundError
        when there is none."""

    def without_reparse_points(self, path: str) -> AbstractContextManager[None]:
        """While it lasts, no reparse point below the directory `path` (none of which the
        admission walk admitted: each was made after it) leads anywhere: each is an empty
        directory or file, its reparse data put back after. OSError if one cannot be."""


class Record(Protocol):
    def add(self, kind: str, name: str, detail: dict | None = None) -> None: ...


Lock = Callable[[str], AbstractContextManager[None]]


def applied(dacl: Dacl, sid: str, step: Step) -> tuple[tuple[Ace, ...], bool]:
    """The explicit entries and protection after `step`. Other trustees' entries keep their
    order; an override turns what was inherited into explicit entries, in the same order, so
    every other trustee's access is evaluated exactly as before."""
    others = [a for a in dacl.explicit if a.sid != sid]
    if step.mode == GRANT:
        return (*others, *step.aces), dacl.protected
    copies = [a.with_flags(a.flags & ~INHERITED) for a in dacl.aces
              if a.inherited and a.sid != sid]
    return (*others, *copies, *step.aces), True


def reverted(dacl: Dacl, detail: dict) -> tuple[tuple[Ace, ...], bool]:
    prior = tuple(Ace.from_hex(text) for text in detail["prior"])
    if detail["mode"] == OVERRIDE:
        return prior, detail["protected"]
    kept = [a for a in dacl.explicit if a.sid != detail["sid"]]
    for index, ace in enumerate(prior):
        if ace.sid == detail["sid"]:
            kept.insert(min(index, len(kept)), ace)
    return tuple(kept), dacl.protected


def apply(steps: Iterable[Step], sid: str, store: AclStore, record: Record, lock: Lock,
          walked: Mapping[str, str]) -> None:
    """Apply `steps`; `walked` holds the file id the walk saw at each path (as walked)."""
    for step in steps:
        with lock(step.path), store.opened(step.path) as target:
            found = target.identity()
            if found != walked.get(step.path):
                raise SetupError("path_replaced", f"{step.path}: it is no longer the file that "
                                 "was admitted (replaced while the launch was being set up); "
                                 "nothing was changed on it", stage="filesystem")
            dacl = target.read()
            kept = dacl.aces if step.mode == SHIELD else dacl.explicit
            record.add(KIND, step.path, {
                "sid": sid, "mode": step.mode, "prior": [a.hex() for a in kept],
                "protected": dacl.protected, "file_id": found}
                | ({"control": dacl.control} if step.mode == SHIELD else {}))
            target.write(*applied(dacl, sid, step))


def revert(path: str, detail: dict, store: AclStore,
           lock: Lock = lambda path: contextlib.nullcontext()) -> None:
    with lock(path), contextlib.ExitStack() as stack:
        try:
            target = stack.enter_context(store.opened(path))
        except FileNotFoundError:
            return  # gone, and its DACL with it
        if target.identity() != detail["file_id"]:
            raise RemovalError("the path names another file than the one whose DACL changed")
        dacl = target.read()
        if detail["mode"] == SHIELD:
            prior = Dacl.with_control(tuple(Ace.from_hex(text) for text in detail["prior"]),
                                      detail["control"])
            if prior != dacl:
                target.restore(prior)
            return
        explicit, protected = reverted(dacl, detail)
        if (explicit, protected) != (dacl.explicit, dacl.protected):
            with store.without_reparse_points(path):
                target.write(explicit, protected)
