"""Standing grants on runtime roots (issue 31, D10): a read root granted once, for every later
launch that reads it, instead of walked, granted and reverted by each launch.

A launch's AppContainer is new each time, so what lasts cannot name it: the grant names a
*capability SID* of the root's own (S-1-15-3-1024-…, the shape Windows derives for a named
capability; computed from this user, the root's path and its file id), and each launch that
reads the root carries that capability in its token (SECURITY_CAPABILITIES). Windows grants an
AppContainer what its package SID *or* one of its capabilities is allowed, and only when the
user's own access allows it too, so the capability gives no one more than the user has, and
only launches whose policy reads the root hold it.

Eligible (`eligible`): a read root that no write root, denied path or other root of the same
request lies in or around — a launch that overrides anything inside a root (hiding a denied
name, making a name read-only) cannot take a standing grant away from itself alone.

Each root's grant is a ledger of its own (`standing/<digest>.json` in the state directory,
which every launch masks): written and synced before the DACL changes, as the launch ledger's
records are, holding what grants.revert needs. Reused while the root is the same file and its
DACL still holds the entry (one open, one DACL read: no walk); otherwise taken back and made
anew. `revoke_all` (`stockade reconcile --revoke-runtime-grants`) takes every one back that
it can, keeping (and naming) each record it cannot.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from stockade.errors import SetupError
from stockade.launch.hostpaths import upcase
from stockade.launch.request import LaunchRequest
from stockade.lifecycle import lease, removers, statedir
from stockade.windows import aceplan, admission, grants
from stockade.windows.acl import Ace
from stockade.windows.grants import AclStore, Lock

_CAPABILITY = re.compile(r"S-1-15-3-1024(-[0-9]{1,10}){8}")
_RECORD = re.compile(r"[0-9a-f]{64}\.json")
DIRECTORY = "standing"


class NotStanding(Exception):
    """`ensure`'s admission found the root unfit for a standing grant (a file in it has a name
    outside it): the launch grants it as its own."""


def capability_sid(user_sid: str, root: str, file_id: str) -> str:
    """The capability that reads `root` while it is the file `file_id`: a new file at that
    path (an interpreter reinstalled) gets another, so an entry left on the old one is of use
    to no later launch."""
    digest = hashlib.sha256(f"stockade-runtime\0{user_sid}\0{upcase(root)}\0{file_id}"
                            .encode()).digest()
    words = [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 32, 4)]
    return "S-1-15-3-1024-" + "-".join(map(str, words))


def is_capability(sid: str) -> bool:
    return bool(_CAPABILITY.fullmatch(sid))


def eligible(request: LaunchRequest, covered: frozenset[str]) -> list[str]:
    """The read roots of `request` a standing grant may serve (the module's docstring)."""
    writes = {g.path for g in request.write}
    reads = [g.path for g in request.read if g.path not in writes and g.path not in covered]
    others = [*writes, *(d.path for d in request.deny)]
    return [root for root in reads
            if not any(admission.inside(p, root) or admission.inside(root, p)
                       for p in others + [r for r in reads if r != root])]


def held(dacl_aces: tuple[Ace, ...], capability: str) -> bool:
    """Whether the standing entry is still on the root (someone may have reset its DACL)."""
    return any(a == ace for a in dacl_aces for ace in _aces(capability))


def _aces(capability: str) -> tuple[Ace, ...]:
    return aceplan.root_aces(capability, write=False, exec_from_write=False)


@dataclass
class StandingGrants:
    """The standing grants of the state directory `root` (default: this process's)."""

    root: str = ""

    def __post_init__(self) -> None:
        self.directory = os.path.join(self.root or statedir.state_dir(), DIRECTORY)

    def _path(self, root: str) -> str:
        return os.path.join(self.directory,
                            hashlib.sha256(upcase(root).encode()).hexdigest() + ".json")

    def load(self, root: str) -> dict | None:
        try:
            with open(self._path(root)) as f:
                body = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raise removers.RemovalError(f"the standing grant record of {root} is unreadable; "
                                        f"inspect {self._path(root)}") from None
        validate(body)
        return body

    def ensure(self, root: str, user_sid: str, store: AclStore, lock: Lock,
               admit: Callable[[str], list[admission.Entry]]) -> str:
        """The capability reading `root`, granted now unless still standing. `admit` walks
        and admits the root (raising as a launch's own grant would) when it must be granted."""
        with lock(f"standing:{root}"):
            found = self.load(root)
            if found is not None:
                try:
                    with store.opened(root) as target:
                        same = target.identity() == found["detail"]["file_id"]
                        if same and held(target.read().explicit, found["capability"]):
                            return found["capability"]
                except FileNotFoundError:
                    pass
                try:
                    self._revoke(root, found, store, lock)
                except removers.RemovalError as exc:
                    raise SetupError("runtime_grant_stuck", f"{exc}; run `stockade reconcile "
                                     "--revoke-runtime-grants` once it can be",
                                     stage="filesystem") from exc
            entries = admit(root)
            file_id = entries[0].file_id
            capability = capability_sid(user_sid, root, file_id)
            step = aceplan.Step(root, aceplan.GRANT, _aces(capability))
            grants.apply([step], capability, store, _Writer(self, root, capability), lock,
                         {root: file_id})
            return capability

    def revoke_all(self, store: AclStore, lock: Lock) -> tuple[list[str], list[str]]:
        """Take every standing grant back: the roots done, and why each record kept was (one
        that cannot be taken back, or is not a valid record, stays; the others are still
        tried). A record whose root now names another file is dropped (the entry went, or
        stays on a file no capability of a later launch will name)."""
        done, kept = [], []
        for name in sorted(_listdir(self.directory)):
            if not _RECORD.fullmatch(name):
                continue
            path = os.path.join(self.directory, name)
            try:
                with open(path) as f:
                    body = json.load(f)
                validate(body)
                with lock(f"standing:{body['path']}"):
                    self._revoke(body["path"], body, store, lock)
            except (OSError, ValueError, removers.RemovalError) as exc:
                kept.append(f"{path}: {exc}")
                continue
            done.append(body["path"])
        return done, kept

    def _revoke(self, root: str, body: dict, store: AclStore, lock: Lock) -> None:
        """Take the grant of `body` back and drop its record; RemovalError (the record kept)
        if it cannot be (a reparse point below that cannot be set aside, access denied)."""
        try:
            grants.revert(root, body["detail"], store, lock)
        except removers.RemovalError:
            if self._same_file(root, body, store):
                raise  # (our entry is still on it)
            # (another file at the path now: nothing of ours on it to take back)
        except OSError as exc:
            raise removers.RemovalError(f"the standing grant on {root} could not be taken "
                                        f"back ({exc}); its record is kept") from exc
        os.unlink(self._path(root))
        lease.sync_dir(self.directory)

    @staticmethod
    def _same_file(root: str, body: dict, store: AclStore) -> bool:
        try:
            with store.opened(root) as target:
                return target.identity() == body["detail"]["file_id"]
        except FileNotFoundError:
            return False

    def _write(self, root: str, capability: str, detail: dict) -> None:
        """Durable before the DACL changes: written aside, synced, renamed into place."""
        body = {"path": root, "capability": capability, "detail": detail}
        validate(body)
        statedir.ensure(self.directory)
        path = self._path(root)
        temporary = f"{path}.{os.getpid()}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | lease.OPEN_FLAGS, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        lease.sync_dir(self.directory)


@dataclass
class _Writer:
    """grants.Record for one standing grant: its record is the standing file."""

    grants_: StandingGrants
    root: str
    capability: str

    def add(self, kind: str, name: str, detail: dict | None = None) -> None:
        self.grants_._write(name, self.capability, dict(detail or {}))


def revoke_here() -> tuple[list[str], list[str]]:
    """`revoke_all` for this user's state directory, on this host's filesystem."""
    from stockade.windows import leases, tokens
    from stockade.windows.aclstore import WindowsAclStore

    grants_ = StandingGrants()
    if not _listdir(grants_.directory):
        return [], []
    user = tokens.current_user_sid()
    return grants_.revoke_all(WindowsAclStore(),
                              lambda path: leases.briefly(user, path))


def validate(body: object) -> None:
    """Refuse (ValueError) a record whose revert could touch anything but a capability's
    entries on a canonical drive path."""
    if not (isinstance(body, dict) and set(body) == {"path", "capability", "detail"}):
        raise ValueError("a standing grant record has exactly path, capability, detail")
    detail = body["detail"]
    if not (isinstance(body["path"], str) and isinstance(detail, dict)
            and not admission.lexical_refusal(body["path"], long_path=lambda path: path)):
        raise ValueError("a standing grant record names a canonical drive path")
    if not (isinstance(body["capability"], str) and is_capability(body["capability"])
            and detail.get("sid") == body["capability"]
            and detail.get("mode") == aceplan.GRANT and set(detail) == grants.DETAIL_KEYS):
        raise ValueError("a standing grant record is a grant to a Stockade capability")


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
