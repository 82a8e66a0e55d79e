"""The egress fence service's decisions and bookkeeping, pure: who may ask, what a fence is, how
it is ledgered and taken back. The Windows halves are fenceservice.py (the service, its pipe,
the facts it reads from the kernel) and wfpengine.py (`Firewall` over WFP and the loopback
exemption list).

**Who asks.** The caller is the process at the other end of the pipe as the kernel names it
(GetNamedPipeClientProcessId), judged by its own token (`caller_refusal`): never an
AppContainer, a restricted token or one below Medium integrity (a sandbox, whether Stockade's
or another's), and created before the connection was accepted (a pid reused after the caller
exited names a later process). **For what.** The request names a process id and a profile; the
package SID is read from that process's token (`target_refusal`): an AppContainer of the
caller's own user, started after the caller, whose package SID is the one Windows derives
from the profile's name, a Stockade profile (`stockade-ac-<24 hex>`). So a user can fence only
their own Stockade launches, and nothing in the sandbox can ask for anything.

**A fence** (`Fences.fence`): the filters of its mode's plan (wfp.py), recorded in the ledger
with the keys they will have *before* they are added, in one WFP transaction; then for
`allowlist` the loopback exemption of the package SID, recorded before it is set. One package
SID is fenced once. **Taking it back** is the ledger's settlement, newest first: the exemption
(its SID taken out of the list, every other entry kept), then the filters (each deleted by its
key, and only if it is Stockade's: provider and sublayer checked), but only once no process of
the package SID runs — a filter only ever keeps a running sandbox from something, so none is
removed under one (RemovalError: the record stays, and the service's periodic reconcile
retries). A crash of the service leaves the records for the reconcile at its next start (or
every `RECONCILE_EVERY` seconds), which removes exactly what they name.

The ledger is the lifecycle ledger (stockade/lifecycle/ledger.py) in the service's own state
directory (SYSTEM's, fenceinstall.py); its kinds are registered there by `register_kinds`.
"""

from __future__ import annotations

import re
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stockade.errors import SetupError, StockadeError
from stockade.lifecycle import removers
from stockade.lifecycle.ledger import LaunchRecord, Ledger
from stockade.windows import fenceproto, wfp
from stockade.windows import sid as sids
from stockade.windows.identity import PROFILE_NAME

FILTERS_KIND = "wfpfilters"
EXEMPTION_KIND = "loopexempt"
MEDIUM_INTEGRITY = 0x2000  # SECURITY_MANDATORY_MEDIUM_RID
RECONCILE_EVERY = 10.0  # seconds between the service's reconciles of its ledger
FRAME_WAIT = 5.0  # seconds a frame may take (see FrameWatch)
MAX_PER_USER = 16  # connections of one user served at once (the pipe has 64 instances)
_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NAME = re.compile(r"stockade-fence-[0-9a-f]{24}")


@dataclass(frozen=True)
class TokenFacts:
    """What the kernel says of a process: its token's user, whether it is an AppContainer
    (and its package SID, "" if not), its integrity level (the mandatory label's RID), whether
    it is restricted, and when the process was created (FILETIME, 100 ns units)."""

    user: str
    appcontainer: bool
    package: str
    integrity: int
    restricted: bool
    created: int


class Refusal(Exception):
    """A decision against the caller's request: a stable `code` and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def caller_refusal(caller: TokenFacts, accepted_at: int) -> Refusal | None:
    """Why the process at the other end of the pipe may not use the service, or None."""
    if caller.appcontainer or caller.restricted or caller.integrity < MEDIUM_INTEGRITY:
        return Refusal("fence_caller_sandboxed", "the caller runs in a sandbox (an "
                       "AppContainer, a restricted token or below Medium integrity)")
    if caller.created > accepted_at:
        return Refusal("fence_caller_unknown", "the process the pipe names was created after "
                       "the connection: its id was reused, the caller is gone")
    return None


def target_refusal(caller: TokenFacts, target: TokenFacts, profile: str,
                   derived: str) -> Refusal | None:
    """Why the process the request names is not a Stockade launch of the caller's (`derived`:
    the package SID Windows derives from `profile`), or None."""
    if not (target.appcontainer and sids.is_appcontainer(target.package)):
        return Refusal("fence_target_not_appcontainer",
                       "the process named is not in an AppContainer")
    if target.user.upper() != caller.user.upper():
        return Refusal("fence_target_other_user", "the process named is another user's")
    if not PROFILE_NAME.fullmatch(profile) or derived.upper() != target.package.upper():
        return Refusal("fence_target_not_stockade", "the process named is not in the "
                       "AppContainer of the Stockade profile named")
    if target.created < caller.created:
        return Refusal("fence_target_older", "the process named is older than the caller, "
                       "so not a launch of the caller's")
    return None


class Firewall(Protocol):
    """What a fence changes on the host (wfpengine.py on Windows; a model in the tests)."""

    def add_filters(self, plan: tuple[wfp.Filter, ...], keys: tuple[str, ...]) -> None:
        """Add every filter of `plan` with its key, all or none."""

    def delete_filter(self, key: str) -> None:
        """Delete the filter `key` if it exists (RemovalError if it is not Stockade's)."""

    def exempt(self, sid: str) -> None:
        """Add `sid` to the loopback exemption list, keeping every other entry."""

    def unexempt(self, sid: str) -> None:
        """Take `sid` out of the loopback exemption list, keeping every other entry."""

    def running(self, sid: str) -> bool:
        """Whether a process of package SID `sid` runs."""

    def holders(self, sid: str) -> set[str]:
        """The user SIDs of the processes of package SID `sid` that run."""


def validate_filters(name: str, detail: dict) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError("a wfpfilters record is named stockade-fence-<24 hex>")
    if set(detail) != {"sid", "keys"} or not (isinstance(detail["sid"], str)
                                              and sids.is_appcontainer(detail["sid"])):
        raise ValueError("a wfpfilters detail is exactly a package SID and the keys")
    keys = detail["keys"]
    if not (isinstance(keys, list) and 0 < len(keys) <= wfp.MAX_FILTERS
            and all(isinstance(key, str) and _KEY.fullmatch(key) for key in keys)
            and len(set(keys)) == len(keys)):
        raise ValueError("a wfpfilters record's keys are distinct GUIDs")


def validate_exemption(name: str, detail: dict) -> None:
    if not sids.is_appcontainer(name) or detail:
        raise ValueError("a loopexempt record names a package SID and has no detail")


def kinds(firewall: Firewall) -> dict[str, tuple[Callable[[str, dict], None],
                                                  Callable[[str, dict], None]]]:
    """The fence's ledger kinds, their removers acting through `firewall`. A record is taken
    back newest first, the exemption before the filters, and the ledger goes on past a
    failure: so the filters of a SID whose exemption could not be removed stay (with the
    record, for the next reconcile), never the exemption without them."""
    stuck: set[str] = set()  # package SIDs whose exemption removal failed last

    def remove_filters(name: str, detail: dict) -> None:
        if firewall.running(detail["sid"]):
            raise removers.RemovalError("a process of the fenced AppContainer still runs: its "
                                        "filters stay until it is gone")
        if detail["sid"].upper() in stuck:
            raise removers.RemovalError("the AppContainer's loopback exemption could not be "
                                        "removed: its filters stay until it is")
        for key in detail["keys"]:
            firewall.delete_filter(key)

    def remove_exemption(name: str, detail: dict) -> None:
        try:
            firewall.unexempt(name)
        except BaseException:
            stuck.add(name.upper())
            raise
        stuck.discard(name.upper())

    return {FILTERS_KIND: (validate_filters, remove_filters),
            EXEMPTION_KIND: (validate_exemption, remove_exemption)}


def register_kinds(firewall: Firewall) -> None:
    for kind, (validator, remover) in kinds(firewall).items():
        removers.register(kind, validator, remover)


@dataclass
class Held:
    """One fence in force: its ledger record, package SID and what it holds."""

    record: LaunchRecord
    sid: str
    filters: int
    exemption: bool


class Fences:
    """Every fence of the service, over `firewall` and the ledger `ledger` (whose kinds are
    registered with `register_kinds(firewall)`)."""

    def __init__(self, firewall: Firewall, ledger: Ledger) -> None:
        self._firewall = firewall
        self._ledger = ledger
        self._lock = threading.Lock()
        self._fenced: set[str] = set()

    def holders(self, sid: str) -> set[str]:
        """The users whose processes hold package SID `sid`."""
        return self._firewall.holders(sid)

    def fence(self, mode: str, sid: str, port: int | None) -> Held:
        """Apply the fence of `mode` to package SID `sid`; Refusal if it is fenced already,
        SetupError (with the fence taken back) if a step fails."""
        plan = wfp.plan_for(mode, sid, port)
        with self._lock:
            if sid.upper() in self._fenced:
                raise Refusal("fence_exists", "this AppContainer is fenced already")
            self._fenced.add(sid.upper())
        record = LaunchRecord(self._ledger, secrets.token_hex(16))
        try:
            keys = tuple(str(uuid.uuid4()) for _ in plan)
            record.add(FILTERS_KIND, removers.fresh_name("fence"), {"sid": sid,
                                                                     "keys": list(keys)})
            self._firewall.add_filters(plan, keys)
            if mode == "allowlist":
                record.add(EXEMPTION_KIND, sid)
                self._firewall.exempt(sid)
        except BaseException as exc:
            record.settle(strict=False)
            self._forget(sid)
            if isinstance(exc, OSError | StockadeError):
                why = exc.message if isinstance(exc, StockadeError) else (
                    exc.strerror or exc.__class__.__name__)
                raise Refusal("fence_apply_failed", f"the fence could not be applied ({why}); "
                              "what of it was applied goes once the launch's processes are "
                              "gone") from exc
            raise
        return Held(record, sid, len(plan), mode == "allowlist")

    def release(self, held: Held) -> None:
        """Take `held` back; Refusal `fence_kept` if some of it must wait (the record stays
        for the periodic reconcile)."""
        try:
            held.record.settle(strict=True)
        except SetupError:
            raise Refusal("fence_kept", "a process of the AppContainer still runs, or a "
                          "filter could not be removed: the service takes the rest back "
                          "once it can") from None
        finally:
            self._forget(held.sid)

    def _forget(self, sid: str) -> None:
        with self._lock:
            self._fenced.discard(sid.upper())


class Connection:
    """One caller's connection: its requests answered in order, its fence (one at most)
    taken back at `close`. `caller`: the caller's facts, read when the connection was accepted
    at `accepted_at`; `target(pid)`: the facts of process `pid`; `derive(profile)`: the package
    SID Windows derives from a profile name."""

    def __init__(self, fences: Fences, caller: TokenFacts, accepted_at: int,
                 target: Callable[[int], TokenFacts], derive: Callable[[str], str]) -> None:
        self._fences = fences
        self._refusal = caller_refusal(caller, accepted_at)
        self._caller = caller
        self._target = target
        self._derive = derive
        self._held: Held | None = None
        self.open = True  # (a caller that may not ask is answered once, then cut off)

    def answer(self, body: dict) -> dict:
        """The response to one frame's object. A frame the protocol refuses, or any request
        from a caller that may not ask, closes the connection (`open` false)."""
        try:
            request = fenceproto.request(body)
        except fenceproto.ProtocolError as exc:
            self.open = False
            return fenceproto.refused(exc.code, exc.message)
        if self._refusal is not None:
            self.open = False
            return fenceproto.refused(self._refusal.code, self._refusal.message)
        try:
            return getattr(self, "_" + request["op"])(request)
        except Refusal as exc:
            return fenceproto.refused(exc.code, exc.message)

    def _status(self, request: dict) -> dict:
        return fenceproto.ok(service=fenceproto.SERVICE, modes=list(fenceproto.MODES))

    def _fence(self, request: dict) -> dict:
        if self._held is not None:
            raise Refusal("fence_state", "this connection holds a fence already")
        try:
            target = self._target(request["pid"])
        except OSError:
            raise Refusal("fence_target_not_appcontainer", "the process named cannot be "
                          "opened") from None
        refusal = target_refusal(self._caller, target, request["profile"],
                                 self._derive(request["profile"]))
        if refusal is not None:
            raise refusal
        # (the fence is keyed to the package SID, which Windows derives from the profile
        # name alone: another user's AppContainer of that name has it too, and would be
        # fenced, and exempted, with the caller's)
        if self._fences.holders(target.package) - {self._caller.user}:
            raise Refusal("fence_target_shared", "a process of another user holds this "
                          "AppContainer's package SID (a profile of the same name)")
        self._held = self._fences.fence(request["mode"], target.package,
                                        request.get("proxy_port"))
        return fenceproto.ok(filters=self._held.filters, exemption=self._held.exemption)

    def _release(self, request: dict) -> dict:
        if self._held is None:
            raise Refusal("fence_state", "this connection holds no fence")
        held, self._held = self._held, None
        self._fences.release(held)
        return fenceproto.ok()

    @property
    def holding(self) -> bool:
        """Whether the connection holds a fence (it may then wait idle for `release`)."""
        return self._held is not None

    def close(self) -> None:
        """The caller is gone (or the service stops): its fence, if any, is taken back."""
        held, self._held = self._held, None
        if held is not None:
            try:
                self._fences.release(held)
            except Refusal:
                pass  # (kept in the ledger: the periodic reconcile takes it back)


class FrameWatch:
    """Cuts a connection (`cut()`: the pipe disconnected, which fails its pending read) whose
    frame is not whole `wait` seconds after it began: from its first byte, or, for a
    connection holding no fence, from when the service waits for it. So a caller that sends
    nothing, or a frame byte by byte, cannot keep one of the pipe's instances; a connection
    holding a fence waits idle for its `release` (the fence lasts as long as it)."""

    def __init__(self, cut: Callable[[], object], wait: float) -> None:
        self._cut, self._wait = cut, wait
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    def frame(self, read: Callable[[int], bytes], idle: bool) -> Callable[[int], bytes]:
        """`read` for one frame; `idle`: whether the wait for its first byte is unbounded."""
        if not idle:
            self._arm()

        def watched(size: int) -> bytes:
            data = read(size)
            if data:
                self._arm()
            return data
        return watched

    def done(self) -> None:
        """The frame is whole."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def close(self) -> None:
        """The connection ends: no cut after this (its handle may be another's)."""
        with self._lock:
            self._closed = True
        self.done()

    def _arm(self) -> None:
        with self._lock:
            if self._timer is None and not self._closed:
                self._timer = threading.Timer(self._wait, self._expire)
                self._timer.daemon = True
                self._timer.start()

    def _expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cut()


def serve(read: Callable[[int], bytes], write: Callable[[bytes], object],
          connection: Connection, watch: FrameWatch | None = None) -> None:
    """Answer `connection`'s frames until the caller closes it or the protocol refuses one;
    then take its fence back. `read(n)` / `write(data)`: the pipe; `watch`, if given, bounds
    the time each frame takes."""
    try:
        while connection.open:
            try:
                if watch is None:
                    body = fenceproto.read_frame(read)
                else:
                    body = fenceproto.read_frame(watch.frame(read, connection.holding))
                    watch.done()
            except fenceproto.ProtocolError as exc:
                write(fenceproto.encode(fenceproto.refused(exc.code, exc.message)))
                return
            if body is None:
                return
            write(fenceproto.encode(connection.answer(body)))
    except OSError:
        return  # (the pipe broke: the caller is gone)
    finally:
        connection.close()
