"""The launch ledger: a write-ahead record of every durable thing a launch creates.

    with ledger.launch(request.request_id) as record:
        path = os.path.join(parent, record.fresh_name("proxy"))
        record.add("dir", path)        # durable before the directory exists
        os.mkdir(path, 0o700)
        ...                            # on leaving, the directory is removed, then the record

Nothing is written until the first `add`, so a launch that creates nothing durable pays nothing.
That first `add` creates `records/<sha256 of the request id>.json`: written under a temporary
name, locked — the launch's *lease* (see lease.py), held until it settles and dropped by the
kernel if its owner dies —, fsync'd, then hard-linked into place, so a record is never visible
unlocked. A record is JSON lines: a versioned header, then one line per resource, each fsync'd
before `add` returns. Settling removes the resources (newest first, each by its kind's remover,
see removers.py), then unlinks the record, then drops the lease.

`reconcile()` settles every record whose lease is free (its owner is gone) the same way; it is
idempotent and safe to run concurrently with live launches and other reconcilers. A record it
cannot trust — unparsable, another version, an unknown kind, a name no remover accepts — is
never acted on: it is moved to `quarantine/` for inspection, every name in it is retired
(never handed out again), and `check()` fails with `ledger_corrupt` until an operator has
inspected and deleted it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from stockade.errors import SetupError, UnavailableError
from stockade.lifecycle import lease, removers, statedir

FORMAT = "stockade-ledger"
VERSION = 1
MAX_RECORD = 1 << 20  # bytes; a larger record is corrupt
TEMPORARY_GRACE = 60.0  # seconds before an unlocked temporary record counts as abandoned
_RECORD = re.compile(r"[0-9a-f]{64}\.json")
_TEMPORARY = re.compile(r"\.[0-9a-f]{64}\.[0-9a-f]{16}\.tmp")
_RETIRED_WORDS = re.compile(rb"[0-9a-f]{64}|" + removers.NAME.pattern.encode())
# Why a name in the records directory cannot be opened as a record: a symbolic link (never
# followed), a directory, a file that is not ours to read.
_UNTRUSTED = (errno.ELOOP, errno.EISDIR, errno.EACCES, errno.EPERM, errno.ENXIO)


class CorruptRecord(Exception):
    """A record that cannot be trusted (it is quarantined, never acted on)."""


@dataclass
class Reconciliation:
    """What one `reconcile()` did. `removed` lists (kind, name) pairs."""

    reconciled: int = 0
    removed: list[tuple[str, str]] = field(default_factory=list)
    live: int = 0
    failed: int = 0
    quarantined: int = 0


class Ledger:
    """The ledger in `root` (default: the state directory, see statedir.py)."""

    def __init__(self, root: str | None = None) -> None:
        self.root = root or statedir.state_dir()
        self.records_dir = os.path.join(self.root, "records")
        self.quarantine_dir = os.path.join(self.root, "quarantine")
        self.retired_file = os.path.join(self.root, "retired-names")

    @contextlib.contextmanager
    def launch(self, request_id: str) -> Iterator[LaunchRecord]:
        """The record of one launch; its resources and the record are gone on leaving."""
        record = LaunchRecord(self, request_id)
        try:
            yield record
        except BaseException:
            record.settle(strict=False)
            raise
        record.settle(strict=True)

    def records(self) -> list[str]:
        """Names of the records present now (live or awaiting reconciliation)."""
        return sorted(n for n in _listdir(self.records_dir) if _RECORD.fullmatch(n))

    def quarantined(self) -> list[str]:
        return sorted(_listdir(self.quarantine_dir))

    def check(self) -> None:
        """Raise `ledger_corrupt` while quarantined records await inspection."""
        if self.quarantined():
            raise UnavailableError(
                "ledger_corrupt", "a launch record could not be trusted and was quarantined "
                "for inspection; see `stockade reconcile`")

    def reconcile(self) -> Reconciliation:
        """Settle every record whose owner is gone; quarantine those that cannot be trusted.
        The kinds a backend defines (removers.register) must be registered before, or its
        records are foreign here: callers first call stockade.launch.registry's
        `load_record_kinds`."""
        done = Reconciliation()
        if os.path.lexists(self.root):  # (a file or a link there: refused, naming it)
            statedir.check(self.root)
        else:
            statedir.check_makeable(self.root)
        if not os.path.isdir(self.records_dir):
            return done
        statedir.check(self.records_dir)
        for name in sorted(os.listdir(self.records_dir)):
            self._reconcile_one(name, done)
        return done

    def retired(self) -> set[str]:
        """Names (and request-id digests) never to be handed out again."""
        try:
            with open(self.retired_file, "rb") as f:
                return set(f.read().decode("ascii", "replace").split())
        except FileNotFoundError:
            return set()

    def _reconcile_one(self, name: str, done: Reconciliation) -> None:
        path = os.path.join(self.records_dir, name)
        try:
            fd = lease.open_record(path, os.O_RDWR)
        except FileNotFoundError:
            return  # settled meanwhile
        except OSError as exc:
            if exc.errno not in _UNTRUSTED:
                raise
            done.quarantined += self._quarantine(path, name, b"")
            return
        try:
            try:
                lease.acquire(fd, wait=False)
            except BlockingIOError:
                done.live += 1
                return
            if not _still_at(path, fd):
                return  # its owner settled it between our open and our lock
            if _TEMPORARY.fullmatch(name):
                # Unlocked only between its creation and its lock: young ones may be starting.
                if time.time() - os.fstat(fd).st_mtime > TEMPORARY_GRACE:
                    _unlink(path)  # its owner died before the record held anything
                return
            raw = lease.read_at(fd, MAX_RECORD + 1, 0)
            try:
                resources = _parse(raw, name, os.fstat(fd))
            except CorruptRecord:
                done.quarantined += self._quarantine(path, name, raw)
                return
            failures = _remove_all(resources)
            if failures:
                done.failed += 1
                return
            _unlink(path)
            done.reconciled += 1
            done.removed += [(kind, rname) for kind, rname, _ in resources]
        finally:
            os.close(fd)

    def _quarantine(self, path: str, name: str, raw: bytes) -> bool:
        """Move `path` aside for inspection and retire every name in it; False if another
        reconciler did it first."""
        statedir.ensure(self.quarantine_dir)
        words = {w.decode() for w in _RETIRED_WORDS.findall(raw)} | {name.split(".")[0]}
        fd = os.open(self.retired_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | lease.OPEN_FLAGS,
                     0o600)
        try:
            os.write(fd, "".join(f"{w}\n" for w in sorted(words)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(path, os.path.join(self.quarantine_dir, f"{name}.{time.time_ns()}"))
        except FileNotFoundError:
            return False
        lease.sync_dir(self.quarantine_dir)
        lease.sync_dir(self.records_dir)
        return True


class LaunchRecord:
    """One launch's record; created on the first `add`. Thread-safe."""

    def __init__(self, ledger: Ledger, request_id: str) -> None:
        self._ledger = ledger
        self.digest = hashlib.sha256(request_id.encode()).hexdigest()
        self.path = os.path.join(ledger.records_dir, f"{self.digest}.json")
        self._lock = threading.Lock()
        self._fd = -1
        self._settled = False
        self._resources: list[tuple[str, str, dict]] = []

    def fresh_name(self, purpose: str) -> str:
        """A name for something this launch will create, never handed out before."""
        retired = self._ledger.retired()
        while (name := removers.fresh_name(purpose)) in retired:
            pass
        return name

    def add(self, kind: str, name: str, detail: dict | None = None) -> None:
        """Record a resource durably; create it only after this returns."""
        detail = detail or {}
        removers.validate(kind, name, detail)
        if kind != "process" and os.path.basename(name) in self._ledger.retired():
            raise SetupError("ledger_identity_reused",
                             "this name was seen in a quarantined record", stage="ledger")
        line = _line({"add": {"kind": kind, "name": name, "detail": detail}})
        with self._lock:
            if self._settled:
                raise SetupError("ledger_settled", "this launch has settled", stage="ledger")
            if self._fd < 0:
                self._create()
            _write_all(self._fd, line)
            os.fsync(self._fd)
            self._resources.append((kind, name, detail))

    def settle(self, *, strict: bool) -> None:
        """Remove every resource, newest first, then the record, then drop the lease. If a
        removal fails the record stays for the next reconcile, and `strict` raises."""
        with self._lock:
            self._settled = True
            if self._fd < 0:
                return
            failures = _remove_all(self._resources)
            if not failures:
                _unlink(self.path)
            os.close(self._fd)
            self._fd = -1
        if failures and strict:
            raise SetupError("ledger_settle_failed",
                             f"{failures} durable resource(s) could not be removed; "
                             "the next reconcile retries", stage="settle")

    def abandon(self) -> None:
        """Leave every resource recorded and drop the lease, so that the next reconcile removes
        them: for resources that cannot be removed safely yet (a sandbox's processes not all
        gone). Nothing can be added after."""
        with self._lock:
            self._settled = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _create(self) -> None:
        ledger = self._ledger
        statedir.ensure(ledger.root)
        statedir.ensure(ledger.records_dir)
        if self.digest in ledger.retired() or os.path.lexists(self.path):
            raise SetupError("ledger_identity_reused",
                             "this request id was used before", stage="ledger")
        temporary = os.path.join(ledger.records_dir,
                                 f".{self.digest}.{os.urandom(8).hex()}.tmp")
        fd = lease.open_record(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        try:
            lease.acquire(fd, wait=True)
            _write_all(fd, _line({"format": FORMAT, "version": VERSION,
                                  "request": self.digest, "owner_pid": os.getpid(),
                                  "created": time.time()}))
            os.fsync(fd)
            try:
                os.link(temporary, self.path)
            except FileExistsError:
                raise SetupError("ledger_identity_reused", "this request id was used before",
                                 stage="ledger") from None
        except BaseException:
            os.close(fd)
            _unlink(temporary)
            raise
        _unlink(temporary)
        self._fd = fd


def _parse(raw: bytes, name: str, info: os.stat_result) -> list[tuple[str, str, dict]]:
    """The resources of a record, or CorruptRecord."""
    if (len(raw) > MAX_RECORD or not raw.endswith(b"\n") or not lease.owned(info)
            or not stat.S_ISREG(info.st_mode) or not _RECORD.fullmatch(name)):
        raise CorruptRecord(name)
    try:
        header, *lines = (json.loads(line) for line in raw[:-1].split(b"\n"))
        if (header.get("format"), header.get("version"), header.get("request")) != (
                FORMAT, VERSION, name.split(".")[0]):
            raise CorruptRecord(name)
        resources = []
        for line in lines:
            if set(line) != {"add"} or set(line["add"]) != {"kind", "name", "detail"}:
                raise CorruptRecord(name)
            kind, rname, detail = (line["add"][key] for key in ("kind", "name", "detail"))
            if not (isinstance(kind, str) and isinstance(rname, str)
                    and isinstance(detail, dict)):
                raise CorruptRecord(name)
            removers.validate(kind, rname, detail)
            resources.append((kind, rname, detail))
        return resources
    except (ValueError, TypeError, KeyError, AttributeError):
        raise CorruptRecord(name) from None


def _remove_all(resources: list[tuple[str, str, dict]]) -> int:
    """Remove resources newest first; the number that could not be removed."""
    failures = 0
    for kind, name, detail in reversed(resources):
        try:
            removers.REMOVERS[kind](name, detail)
        except (OSError, removers.RemovalError):
            failures += 1
    return failures


def _line(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _still_at(path: str, fd: int) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    lease.sync_dir(os.path.dirname(path))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):  # (then there is none: making it says why)
        return []
