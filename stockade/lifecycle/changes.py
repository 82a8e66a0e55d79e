"""The change sets of copy-on-write runs (`filesystem.workspace = "overlay"`), kept in the
state directory until they are applied or discarded.

    <state>/changes/<run id>/meta.json       what ran, over which write roots, under which
                                             protections; its status
    <state>/changes/<run id>/base-<i>.json   write root i as it was when the run started
    <state>/changes/<run id>/layers/<i>/     its overlay's upper and work directories
    <state>/changes/<run id>/lock            locked while the run goes on

A change set is made whole under a temporary name (`.new-<id>`), every file fsync'd, then
renamed into place before the sandbox starts: one is either complete and listed, or not there
at all (a temporary one is abandoned work, removed by `stockade reconcile`). One is discarded
by renaming it aside (`.discarding-<id>`) first, then removing it: whatever stops the removal
(a crash, a tree that will not go), the set is never listed again half-removed, and what was
left aside is removed by the next discard or `stockade reconcile`. Its directory is locked
(flock) from before the rename until it is gone, so that discards at once in one store each
remove their own and sweep only what nobody is removing. Its status says
"running" until the run ends; one that says so while its lock is free belongs to a run that
crashed, and is listed as "interrupted", its changes kept: nothing is ever lost silently.
Applying or discarding is refused while its lock is held.

Each set is sealed when its run starts (stockade/lifecycle/changeseal.py: an HMAC, under a
per-user key kept where the password database says, never in the state directory, of the
roots, protections and baseline its run was granted); `apply` refuses a set whose seal does
not verify, `changes_untrusted`.

Every directory of the store is made mode 0700, one by one, whatever the umask (issue 30). A
change set is acted on only while its store is the user's alone all the way down (`trusted`):
the state directory, `changes/`, the set's directory, its meta.json and baseline files and its
layer directories are real directories and files (no links), owned by the user and writable
by no group or other user; and its `created` is not in the future (a set planted to be the
newest). Anything else is `changes_untrusted`, naming the path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stockade.errors import ChangesError
from stockade.lifecycle import (
    changeapply,
    changescan,
    changeseal,
    changeview,
    lease,
    statedir,
    treewalk,
)
from stockade.lifecycle.changelayout import CAPABILITY, UPPER, WORK, layer_dir
from stockade.lifecycle.changescan import Change, Fingerprint
from stockade.policy.model import protected_whole

FORMAT = "stockade-changes"
VERSION = 1
DIRECTORY = "changes"
_TEMPORARY = ".new-"
_DISCARDING = ".discarding-"
RELEASE_GRACE = 2.0  # seconds a finished run's lock may still be held by a forked copy


def store(state: str | None = None) -> str:
    """Where change sets are kept."""
    return os.path.join(state or statedir.state_dir(), DIRECTORY)


@dataclass
class ChangeSet:
    """One overlaid run's pending changes: `added`, `modified` and `deleted` (paths on the
    host), `unshown`, `changes()`, `diff()`, `apply()`, `discard()`."""

    path: str
    meta: dict = field(repr=False)
    _lock: int = field(default=-1, repr=False)
    _base: dict[str, dict[str, Fingerprint]] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return self.meta["id"]

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(self.meta["roots"])

    @property
    def status(self) -> str:
        """"running", "interrupted" (its run crashed: the changes are kept) or "finished"."""
        if self.meta["status"] != "running":
            return self.meta["status"]
        return "running" if self.busy() else "interrupted"

    def busy(self) -> bool:
        """Whether its run still goes on (it holds the lock)."""
        if self._lock >= 0:
            return True
        try:
            fd = os.open(os.path.join(self.path, "lock"), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            import fcntl  # (POSIX: the overlay is Linux's alone)

            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def upper(self, index: int) -> str:
        return os.path.join(layer_dir(self.path, index), UPPER)

    def base(self) -> dict[str, dict[str, Fingerprint]]:
        if self._base is None:
            self._keep_base(_bases(self.path, len(self.roots)))
        assert self._base is not None
        return self._base

    def _keep_base(self, bases: list[bytes]) -> None:
        self._base = {root: {rel: tuple(v) for rel, v in json.loads(data).items()}
                      for root, data in zip(self.roots, bases, strict=True)}

    def changes(self) -> list[Change]:
        """Every change, root by root, parents first."""
        base = self.base()
        return [change for index, root in enumerate(self.roots)
                for change in changescan.scan(root, self.upper(index), base[root])]

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes() if c.kind == "added")

    @property
    def modified(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes() if c.kind == "modified")

    @property
    def deleted(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes() if c.kind == "deleted")

    @property
    def unshown(self) -> tuple[str, ...]:
        """What the review cannot show (an unreadable entry, a tree too deep), each as
        `path: why`; `apply()` refuses a set that has any."""
        return tuple(f"{c.path}: {c.note}" for c in self.changes() if c.kind == "unshown")

    def diff(self, changes: list[Change] | None = None) -> str:
        """A unified diff of every change (text files; a line for the others), every
        character that is not plainly visible escaped (changeview); of `changes`, from
        `changes()`, if given."""
        found = self.changes() if changes is None else changes
        return "".join(changeview.diff(change) for change in found)

    def apply(self, *, home_config: bool = False, check_seal: bool = True,
              key_dir: str | None = None) -> list[Change]:
        """Apply every change to the real workspace, then drop the change set. Refused whole
        (ChangesError, `changes_conflict` or `changes_refused`, listing each) if any change
        conflicts with the host, may never land (by the run's policy, or the credential
        stores and start-up files no set ever writes: changeapply.never_applied), or cannot
        be shown by the review; (`changes_home_config`) if one is to the home directory
        itself or its hidden entries (changeapply.HomeConfig)
        and `home_config` is not True; and (`changes_untrusted`) unless its seal verifies
        under this user's key: the roots, protections and baseline are the ones its run was
        granted (changeseal). Tests only, to prove the evidence rows that plant sets can fail:
        `check_seal` False skips that; `key_dir` verifies under the key in that directory."""
        self._not_busy("applied")
        bases = _bases(self.path, len(self.roots))
        if check_seal:
            changeseal.verify(key_dir or changeseal.key_dir(), self.meta, bases)
        self._keep_base(bases)  # (the baseline verified is the one applied against)
        changes = self.changes()
        refused = changeapply.refusals(changes, self.meta["protected"], self.meta["deny"],
                                       self.meta["git"], changeapply.never_applied(self.roots))
        if refused:
            raise changeapply.refuse("changes_refused", refused,
                                     "changes the policy never lets land")
        home = [] if home_config else changeapply.home_refusals(changes,
                                                                changeapply.home_config(self.roots))
        if home:
            raise changeapply.refuse("changes_home_config", home,
                                     "changes to the home directory's configuration, applied "
                                     f"only with `{changeapply.HOME_CONFIG_OPTION}`")
        conflicting = changeapply.conflicts(changes, self.base())
        if conflicting:
            raise changeapply.refuse("changes_conflict", conflicting,
                                     "the workspace changed on the host since the run started")
        changeapply.apply(changes)
        self.discard()
        return changes

    def discard(self) -> None:
        """Drop every change: nothing of the change set is left (ChangesError
        `changes_not_removed` if something stops its removal: it is no longer listed, and the
        next discard tries again)."""
        self._not_busy("discarded")
        parent = os.path.dirname(self.path)
        aside = os.path.join(parent, _DISCARDING + self.id)
        # Locked before it is renamed aside, and held until it is gone: discards in one store
        # at once each remove their own, and sweep only what nobody is removing.
        held = _removal_lock(self.path)
        if held is None:
            raise ChangesError("changes_busy", f"the run {self.id}'s changes are being "
                               "discarded by another `stockade discard`")
        try:
            os.rename(self.path, aside)
            _remove_aside(aside, held)
        finally:
            os.close(held)
        for path in _discarded(parent):
            _sweep(path)
        _remove_if_empty(parent)

    def _not_busy(self, what: str) -> None:
        # A run that recorded its end let go of its lock; a process forked meanwhile (another
        # thread's launch, until it closes what it inherited or execs) may hold a copy of the
        # descriptor a moment longer: that is waited out, briefly.
        ended = self._lock < 0 and self.meta["status"] == "finished"
        deadline = time.monotonic() + (RELEASE_GRACE if ended else 0.0)
        while self.busy():
            if time.monotonic() >= deadline:
                raise ChangesError("changes_busy", f"the run {self.id} is still going: its "
                                   f"changes can be {what} once it has ended")
            time.sleep(0.02)

    # --- the owner's side of a run ----------------------------------------------------------

    def finish(self, exit_code: int | None) -> None:
        """The run has ended: record it, and let go of the lock."""
        self.meta |= {"status": "finished", "exit_code": exit_code, "ended": time.time()}
        _write_json(os.path.join(self.path, "meta.json"), self.meta, replace=True)
        self.release()

    def release(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    def checkpoint(self) -> str:
        """A copy of the upper layers as they are now (the sandbox must be idle); returns its
        name, for `rollback`."""
        name = f"{len(self._snapshots()) + 1}"
        target = os.path.join(self.path, "snapshots", name)
        _private_dirs(os.path.dirname(target))
        scratch = target + ".new"
        remove_tree(scratch)
        os.mkdir(scratch, 0o700)
        for index in range(len(self.roots)):
            copy_layer(self.upper(index), os.path.join(scratch, str(index)))
        os.rename(scratch, target)
        return name

    def rollback(self, name: str) -> None:
        """The upper layers as `checkpoint` `name` copied them (the overlay must not be
        mounted: a warm sandbox is restarted around it)."""
        source = os.path.join(self.path, "snapshots", name)
        if not os.path.isdir(source):
            raise ChangesError("changes_not_found", f"no checkpoint {name!r} in run {self.id}")
        for index in range(len(self.roots)):
            layer = layer_dir(self.path, index)
            remove_tree(os.path.join(layer, WORK))
            os.mkdir(os.path.join(layer, WORK), 0o700)
            remove_tree(self.upper(index))
            copy_layer(os.path.join(source, str(index)), self.upper(index))

    def _snapshots(self) -> list[str]:
        try:
            return [n for n in os.listdir(os.path.join(self.path, "snapshots"))
                    if not n.endswith(".new")]
        except FileNotFoundError:
            return []


def begin(run: str, argv: Sequence[str], roots: Sequence[str], *, protected: Iterable[str],
          git: str, deny: Sequence[str], state: str | None = None) -> ChangeSet:
    """A new change set for the run `run` of `argv` over the write roots `roots`, made before
    its sandbox starts (the baseline of each root, empty layers) and locked for the run.
    `protected`, `git` and `deny` are its launch request's (what `apply` must never land)."""
    parent = store(state)
    statedir.ensure(os.path.dirname(parent))
    roots = list(roots)
    from stockade.errors import UnenforceableError

    for root in roots:
        if not os.path.isdir(root):
            # Only a directory can be an overlay's lower layer: a file granted for writing
            # would be mounted as itself, and the command would write the host's file.
            raise UnenforceableError(
                CAPABILITY, f"the write root {root} is not a directory, which an "
                "overlaid workspace cannot hold back: grant the directory holding it, or use "
                'filesystem.workspace = "direct"')
        if _inside(parent, root):
            raise UnenforceableError(
                CAPABILITY, f"Stockade's state directory {parent} lies inside the write "
                f"root {root}, which an overlay cannot have its upper layer in: choose a state "
                "directory outside the workspace (--state-dir, STOCKADE_STATE_DIR)")
    scratch = os.path.join(parent, _TEMPORARY + run)
    final = os.path.join(parent, run)
    _make_in_store(parent, scratch)
    try:
        meta = {"format": FORMAT, "version": VERSION, "id": run, "created": time.time(),
                "argv": list(argv), "roots": roots,
                "protected": sorted(protected_whole(protected, git, guards_git=True)),
                "deny": list(deny), "git": git,
                "status": "running", "exit_code": None}
        for index, root in enumerate(roots):
            _write_json(os.path.join(scratch, f"base-{index}.json"), changescan.baseline(root))
            layer = layer_dir(scratch, index)
            _private_dirs(layer)
            # The overlay's root shows its upper directory's mode and owner: the root's own.
            info = os.stat(root)
            os.mkdir(os.path.join(layer, UPPER), 0o700)
            os.chmod(os.path.join(layer, UPPER), stat.S_IMODE(info.st_mode))
            if os.getuid() == 0:
                os.chown(os.path.join(layer, UPPER), info.st_uid, info.st_gid)
            os.mkdir(os.path.join(layer, WORK), 0o700)
        meta["seal"] = changeseal.seal(changeseal.make_key(changeseal.key_dir()), meta,
                                       _bases(scratch, len(roots)))
        _write_json(os.path.join(scratch, "meta.json"), meta)
        lock = os.open(os.path.join(scratch, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                       0o600)
        import fcntl  # (POSIX: the overlay is Linux's alone)

        fcntl.flock(lock, fcntl.LOCK_EX)
        lease.sync_dir(scratch)
        os.rename(scratch, final)
        lease.sync_dir(parent)
    except BaseException:
        remove_tree(scratch)
        raise
    return ChangeSet(final, meta, lock)


def _bases(path: str, count: int) -> list[bytes]:
    """The baseline files of the change set at `path`, as written (what its seal covers);
    ChangesError `changes_broken` if one cannot be read (a set an older Stockade left
    half-removed: `discard` finishes it)."""
    found = []
    for index in range(count):
        name = os.path.join(path, f"base-{index}.json")
        try:
            with open(name, "rb") as f:
                found.append(f.read())
        except OSError as exc:
            raise ChangesError("changes_broken", f"the change set {path} cannot be read: "
                               f"{name}: {exc.strerror}; `stockade discard "
                               f"{os.path.basename(path)}` removes it") from None
    return found


def load(run: str | None = None, state: str | None = None, *,
         check_store: bool = True) -> ChangeSet:
    """The change set of run `run` (its id, or a unique prefix of it), or the newest one.
    `check_store` False (tests only: it proves the evidence row that plants a change set can
    fail) skips `trusted`."""
    sets = pending(state, check_store=check_store)
    if not sets:
        raise ChangesError("changes_not_found", "no pending changes (runs with "
                           "filesystem.workspace = \"overlay\" keep theirs until applied or "
                           "discarded)")
    if run is None:
        return sets[-1]
    chosen = [s for s in sets if s.id.startswith(run)] if run else []
    if len(chosen) != 1:
        why = "no pending run" if not chosen else "more than one pending run"
        raise ChangesError("changes_not_found", f"{why} has an id starting {run!r} (see "
                           "`stockade changes --list`)")
    return chosen[0]


def pending(state: str | None = None, *, check_store: bool = True) -> list[ChangeSet]:
    """Every change set kept, oldest first (ChangesError `changes_untrusted` if the store or
    any set in it is not the user's alone: see `trusted`)."""
    parent = store(state)
    if check_store and os.path.lexists(parent):
        _private(os.path.dirname(parent), "the state directory")
        _private(parent, "the change sets' directory")
    sets = []
    for name in _names(parent):
        if name.startswith("."):
            continue
        try:
            with open(os.path.join(parent, name, "meta.json"), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue  # (not one of ours: never acted on)
        if meta.get("format") == FORMAT and meta.get("version") == VERSION \
                and meta.get("id") == name:
            if check_store:
                try:
                    trusted(os.path.join(parent, name), meta)
                except ChangesError:
                    # (another discard renamed it aside while it was checked: gone, not
                    # untrusted; attack 27 R1)
                    if not os.path.lexists(os.path.join(parent, name)):
                        continue
                    raise
            sets.append(ChangeSet(os.path.join(parent, name), meta))
    return sorted(sets, key=lambda s: s.meta["created"])


CLOCK_SLACK = 60.0  # seconds a set's `created` may lie ahead of now (clock adjustments)


def trusted(path: str, meta: dict) -> None:
    """Return if the change set at `path` (its meta.json read as `meta`) is the user's alone
    (see the module docstring); raise ChangesError `changes_untrusted` otherwise."""
    _private(path, "the change set")
    for name in _names(path):
        if name == "meta.json" or name.startswith("base-"):
            _private(os.path.join(path, name), "the change set's file")
    layers = os.path.join(path, "layers")
    _private(layers, "the change set's layers")
    for name in _names(layers):
        _private(os.path.join(layers, name), "the change set's layer")
    created = meta.get("created")
    if not isinstance(created, int | float) or created > time.time() + CLOCK_SLACK:
        raise ChangesError("changes_untrusted", f"the change set {path} says it was made in "
                           "the future: not made by Stockade, never acted on")


def _private(path: str, what: str) -> None:
    """ChangesError `changes_untrusted` unless `path` is no link, is owned by this user, and
    no group or other user may write it."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ChangesError("changes_untrusted", f"{what} {path} cannot be read "
                           f"({exc.strerror})") from None
    why = lease.distrust(info)
    if why is None:
        return
    raise ChangesError("changes_untrusted", f"{what} {path} {why}: someone else could have "
                       "planted or changed it; never acted on")


def _make_in_store(parent: str, path: str) -> None:
    """Make the directory `path` in the store `parent`, making the store again if another
    process's discard removed it, empty, after it was made (a few times: each such removal
    needs the store empty, which a set being made keeps it from staying)."""
    for attempt in range(8):
        _private_dirs(parent)
        try:
            os.mkdir(path, 0o700)
            return
        except FileNotFoundError:
            if attempt == 7:
                raise  # (the store keeps vanishing)


def _private_dirs(path: str) -> None:
    """Make `path` and any missing parent, each mode 0700 (a umask only removes bits: never
    one others can write, unlike os.makedirs' parents)."""
    path = os.path.abspath(path)
    if os.path.isdir(path) or os.path.dirname(path) == path:
        return
    _private_dirs(os.path.dirname(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def abandoned(state: str | None = None, grace: float = 60.0) -> list[str]:
    """Remove change sets that were never complete (a crash while one was being made: its
    run never started), older than `grace` seconds, and what a discard left aside; returns
    their paths."""
    parent = store(state)
    removed = []
    for path in _discarded(parent):
        try:
            if _sweep(path):
                removed.append(path)
        except (ChangesError, OSError):
            continue  # (never listed: the next discard or reconcile tries again)
    for name in _names(parent):
        path = os.path.join(parent, name)
        if not name.startswith(_TEMPORARY):
            continue
        try:
            old = time.time() - os.lstat(path).st_mtime > grace
        except FileNotFoundError:
            continue  # (removed meanwhile by another reconcile)
        if old:
            remove_tree(path)
            removed.append(path)
    return removed


def _removal_lock(path: str) -> int | None:
    """A descriptor holding the exclusive lock of the directory `path` (its removal), or
    None if another process holds it or it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return lease.held(fd)


def _remove_aside(path: str, held: int) -> bool:
    """Remove the tree a discard renamed aside to `path`, whose lock `held` is ours; returns
    False if `path` is no longer that directory (another removed it before we locked it)."""
    try:
        if not os.path.samestat(os.lstat(path), os.fstat(held)):
            return False
    except FileNotFoundError:
        return False
    try:
        remove_tree(path)
    except OSError as exc:
        raise ChangesError("changes_not_removed", f"{path} could not be removed whole "
                           f"({exc.strerror}); it is no longer listed, and the next "
                           "`stockade discard` or `stockade reconcile` tries again") from None
    return True


def _sweep(path: str) -> bool:
    """Remove what an earlier discard left aside at `path` unless another process is removing
    it; returns whether this call removed it."""
    held = _removal_lock(path)
    if held is None:
        return False
    try:
        return _remove_aside(path, held)
    finally:
        os.close(held)


def _discarded(parent: str) -> list[str]:
    """What discards renamed aside in the change sets' directory `parent`."""
    return [os.path.join(parent, name) for name in _names(parent)
            if name.startswith(_DISCARDING)]


def _names(parent: str) -> list[str]:
    """The entries of the change sets' directory (none if it was never made)."""
    try:
        return os.listdir(parent)
    except FileNotFoundError:
        return []


def copy_layer(source: str, target: str) -> None:
    """An upper layer copied: files, links, whiteouts (hard-linked: they never change) and
    the opaque marks of directories."""
    info = os.lstat(source)
    os.mkdir(target, stat.S_IMODE(info.st_mode))
    _copy_marks(source, target)
    for name in os.listdir(source):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        entry = os.lstat(src)
        if stat.S_ISDIR(entry.st_mode):
            copy_layer(src, dst)
        elif stat.S_ISLNK(entry.st_mode):
            os.symlink(os.readlink(src), dst)
        elif changescan.is_whiteout(entry):
            os.link(src, dst, follow_symlinks=False)
        elif stat.S_ISREG(entry.st_mode):
            shutil.copy2(src, dst, follow_symlinks=False)
            _copy_marks(src, dst)
    os.chmod(target, stat.S_IMODE(info.st_mode))


def _copy_marks(source: str, target: str) -> None:
    for name in os.listxattr(source, follow_symlinks=False):
        if name.startswith("user.overlay."):
            os.setxattr(target, name, os.getxattr(source, name, follow_symlinks=False),
                        follow_symlinks=False)


def remove_tree(path: str) -> None:
    """Remove `path` whole, however deep, mode-000 directories too (treewalk.remove)."""
    treewalk.remove(path)


def _remove_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _write_json(path: str, data: object, *, replace: bool = False) -> None:
    target = path + ".tmp" if replace else path
    if replace and os.path.lexists(target):
        os.unlink(target)  # (left by a crash while it was being written)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    if replace:
        os.replace(target, path)
