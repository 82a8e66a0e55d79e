"""The zygote: one launcher interpreter per owner process, starting sandbox skeletons.

Starting an interpreter and importing the launcher costs tens of milliseconds; forking a warm,
single-threaded one costs about one. The zygote keeps one skeleton (see launcher.py: a pid 1
cloned into fresh namespaces, waiting) ready ahead of demand. The owner (any thread, any event loop)
sends each launch's descriptors over a socket — stdin, stdout, stderr, the request pipe, the
status pipe, a control socket and a reply socket; the zygote hands them to the ready skeleton,
answers with a pidfd of its pid 1, and starts the next one. The zygote itself never enters a
namespace and closes each launch's descriptors once handed on, so nothing untrusted ever runs in
a process that holds another launch's state. The next skeleton is started once no handed-over
sandbox is still building its mounts, so that a spare never slows a launch down. The zygote
exits when its owner's end of the socket closes, i.e. when the owner exits or dies; skeletons
that were never used see their handoff socket close and exit too.

After a launch, spares are prepared for that launch's view (frame.view_frame): a template
of that view (template.py) builds its mounts once, and clones PREPARED spares from itself, each
with fresh namespaces, its own proc, /tmp, /dev/shm and /dev/pts, and its pid 1 confined before
it is needed, so that a run of launches with one policy pays only for what is each launch's
own. Neither holds any launch's state: a view frame has no argv, environment, working
directory or id. A launch gets a spare only if its view frame is the same and the owner's
survey of the host, made for this launch, has the identity the template's mounts were made
from (mnt.Survey.identity); otherwise, or when the host's mounts change, the template and its
spares are thrown away (sandboxes already cloned from it run on: the template is no pid
namespace's init). A launch that comes while the next spare of its view is still making
itself ready (about a millisecond) is promised that spare rather than given a sandbox that
builds its view.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from stockade.errors import SetupError, StockadeError
from stockade.linux.fdpass import close_all, recv_fds, send_fds
from stockade.linux.frame import VIEW_MAX
from stockade.linux.launcher import PRODUCTION, PRODUCTION_SHAPE, Shape, Skeleton, start

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# -I -S: no environment, no site-packages, no current directory on sys.path; only Stockade.
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from stockade.linux.zygote import serve; serve(int(sys.argv[2]))")
_FDS_PER_LAUNCH = 7  # stdin, stdout, stderr, request pipe, status pipe, control, reply socket
LANDLOCK_TIER = b"T"  # no namespace: a keeper (landlock_tier.py) instead of a pid 1
_IDENTITY = 32  # bytes of a survey's identity (SHA-256)
_SURVEYED, _UNSURVEYED = b"\x01", b"\x00"  # whether a launch message carries an identity
PREPARED = 2  # spares kept ready for the last view: a run of launches finds one waiting


class Zygote:
    """The owner's side: starts the zygote on first use, restarts it if it died."""

    prepares = True  # it prepares spares for a launch's view (see the module's docstring)

    def may_fit(self, view: bytes) -> bool:
        """Whether a spare may be prepared for `view` (the last view launched): only then is
        the host surveyed for the launch, which for a large write root is a long walk."""
        return view == self._last_view

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._last_view: bytes | None = None

    def launch(self, stdio: tuple[int, int, int], request_r: int, status_w: int, control: int,
               *, shape: Shape = PRODUCTION_SHAPE, view: tuple[bytes, bytes] | None = None,
               tier: bool = False) -> int:
        """Start a sandbox with these descriptors; returns a pidfd of its pid 1 (with `tier`,
        of the keeper of a landlock-tier launch). `view` is (view frame, identity of a survey
        made just now, or b"" when `may_fit` said no survey was worth making): the zygote may
        hand the launch a spare prepared for it, and prepares the next spare for it. A `shape`
        other than production's (tests only) is always made afresh."""
        kind = shape.code()
        if tier:
            kind, view = LANDLOCK_TIER, None
        if view is not None and shape.production and len(view[0]) <= VIEW_MAX:
            surveyed = len(view[1]) == _IDENTITY
            kind += (_SURVEYED + view[1] if surveyed else _UNSURVEYED) + view[0]
            self._last_view = view[0]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [*stdio, request_r, status_w, control, theirs.fileno()]
            with self._lock:
                try:
                    send_fds(self._connected(), kind, fds)
                except OSError:
                    self._stop()  # it died: one fresh start, then give up
                    send_fds(self._connected(), kind, fds)
            theirs.close()
            _, received = recv_fds(mine, 1)
        finally:
            theirs.close()
            mine.close()
        if len(received) != 1:
            close_all(received)
            raise SetupError("launcher_failed", "the sandbox zygote did not start a launcher",
                             stage="launcher")
        return received[0]

    def _connected(self) -> socket.socket:
        if self._sock is None:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, _PACKAGE_PARENT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env={}, cwd="/", stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            theirs.close()
            self._sock = mine
        return self._sock

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.wait()
            self._proc = None


class ForkSpawner:
    """No zygote: the owner forks each skeleton itself. Only for single-threaded programs that
    run one sandbox at a time, such as the CLI, where starting a zygote interpreter would cost
    more than the launch. `prepare` forks the skeleton early, so that it makes its namespaces
    while the program still compiles its policy (or, in the CLI server, before the request
    comes); given a view frame (the CLI server passes the last request's), its mounts are built
    and its pid 1 confined too, and the launch uses it only under the same rule as
    the zygote's prepared spares. A prepared skeleton whose copy of the host's mounts went
    stale is not used."""

    def __init__(self) -> None:
        self._ready: Skeleton | None = None
        self._view: bytes | None = None  # the view frame the ready skeleton is prepared for
        self._mounts: BinaryIO | None = None  # mountinfo, opened before the skeleton was made
        self.on_view: Callable[[bytes], None] | None = None  # told the first launch's view

    @property
    def prepares(self) -> bool:
        """Whether a launch's view is worth computing (see LinuxHandle)."""
        return self._view is not None or self.on_view is not None

    def may_fit(self, view: bytes) -> bool:
        return view == self._view

    def prepare(self, view: bytes | None = None) -> None:
        if self._ready is None:
            self._mounts = open("/proc/self/mountinfo", "rb")  # noqa: SIM115 - see _take
            self._ready = start()
            if view is not None and len(view) <= VIEW_MAX:
                with contextlib.suppress(OSError):  # (if it died, the launch finds out)
                    self._ready.handoff.send(b"V" + view)
                    self._view = view

    def launch(self, stdio: tuple[int, int, int], request_r: int, status_w: int, control: int,
               *, shape: Shape = PRODUCTION_SHAPE, view: tuple[bytes, bytes] | None = None,
               tier: bool = False) -> int:
        if tier:
            from stockade.linux import landlock_tier

            return landlock_tier.start([*stdio, request_r, status_w, control])
        if view is not None and self.on_view is not None:
            self.on_view(view[0])
            self.on_view = None
        skeleton = self._take(shape, view) or start(shape)
        with skeleton.handoff:
            pidfds = [] if skeleton.pidfd is None else [skeleton.pidfd]
            try:
                if skeleton.pidfd is None:  # a stand-in, to report why there is no sandbox
                    _, pidfds = recv_fds(skeleton.handoff, 1)
                if len(pidfds) != 1:
                    raise SetupError("launcher_failed", "the sandbox skeleton did not start",
                                     stage="launcher")
                # (A stand-in waits for these to report on the status pipe: only then may it
                # be reaped.)
                send_fds(skeleton.handoff, b"G", [*stdio, request_r, status_w, control])
            except OSError:
                close_all(pidfds)
                raise SetupError("launcher_failed", "the sandbox's pid 1 ended before its "
                                 "launch", stage="launcher") from None
            except BaseException:
                close_all(pidfds)
                raise
            finally:
                if skeleton.standin:
                    skeleton.handoff.close()  # (it ends at once if it was not handed a launch)
                    os.waitpid(skeleton.standin, 0)
        return pidfds[0]

    def _take(self, shape: Shape, view: tuple[bytes, bytes] | None) -> Skeleton | None:
        """The prepared skeleton, if it still fits: of production's shape, made from the
        host's mounts as they are (mountinfo polls "exceptional" once they change), and, if it
        was prepared for a view, for this launch's view and survey identity."""
        ready, self._ready = self._ready, None
        prepared_for, self._view = self._view, None
        if ready is None:
            return None
        assert self._mounts is not None
        stale = bool(select.select([], [], [self._mounts], 0)[2])
        self._mounts.close()
        if not stale and shape.production and prepared_for is not None:
            said, extra = recv_fds(ready.handoff, 1)  # "M" and the identity, or the end
            close_all(extra)
            stale = view is None or view[0] != prepared_for or said != b"M" + view[1] \
                or len(view[1]) != _IDENTITY
        if stale or not shape.production or ready.pidfd is None:
            ready.close()
            if ready.standin:
                os.waitpid(ready.standin, 0)
            return None
        return ready


ZYGOTE = Zygote()
SPAWNER: Zygote | ForkSpawner = ZYGOTE


def fork_directly() -> ForkSpawner:
    """Make this process fork its sandboxes itself (see ForkSpawner)."""
    global SPAWNER
    if not isinstance(SPAWNER, ForkSpawner):
        SPAWNER = ForkSpawner()
    return SPAWNER


class _Announced:
    """A process being made for one view frame that says "M" + the identity of the survey its
    view was built from once it is done (a template once built, a spare once it waits for a
    launch), or ends if it could not be made."""

    def __init__(self, skeleton: Skeleton, view: bytes) -> None:
        self.skeleton = skeleton
        self.view = view
        self.identity: bytes | None = None  # set once it is done

    @property
    def sock(self) -> socket.socket:
        return self.skeleton.handoff

    def read(self) -> bool:
        """Take its one message; False when it has ended."""
        data, fds = recv_fds(self.sock, 1)
        close_all(fds)
        if data[:1] == b"M" and len(data) == 1 + _IDENTITY:
            self.identity = data[1:]
            return True
        return False

    def close(self) -> None:
        self.skeleton.close()


class _Template(_Announced):
    """The template of the wanted view (template.py): once built, it clones a spare for that
    view whenever asked."""

    def __init__(self, view: bytes) -> None:
        from stockade.linux import template

        super().__init__(template.start(view), view)

    def spare(self) -> _Prepared | None:
        """A spare cloned from it, still making itself ready; None if the template is gone."""
        try:
            self.sock.send(b"S")
            data, fds = recv_fds(self.sock, 2)
        except OSError:
            return None
        if data != b"S" or len(fds) != 2:
            close_all(fds)
            return None
        return _Prepared(Skeleton(socket.socket(fileno=fds[0]), fds[1]), self.view)


class _Prepared(_Announced):
    """A spare cloned from a view's template (its identity is the template's)."""

    def fits(self, view: bytes, identity: bytes) -> bool:
        return self.identity is not None and self.identity == identity and self.view == view


def serve(control_fd: int) -> None:
    """The zygote's main loop (runs in its own interpreter)."""
    # Everything a sandbox needs is imported here, once, before any fork.
    import stockade.linux.landlock_tier  # noqa: F401
    import stockade.linux.template  # noqa: F401
    from stockade.launch import request  # noqa: F401
    from stockade.linux import init, mnt, ns  # noqa: F401

    # Sandboxes' pid 1 processes are the zygote's children, reaped by the kernel.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    ready: Skeleton | None = None  # a spare with namespaces only, for any view
    template: _Template | None = None  # the wanted view, built once; spares are cloned from it
    prepared: list[_Prepared] = []  # spares cloned from it, oldest first
    # launches promised a spare still making itself ready: (spare, launch, reply, identity)
    promised: list[tuple[_Prepared, list[int], int, bytes]] = []
    wanted: bytes | None = None  # the view frame to prepare the next spares for
    mounting: list[socket.socket] = []  # handed-over skeletons still building their mounts
    # A spare's mount namespace is a copy of the host's from when it was made: when the host's
    # mounts change, it is stale and is thrown away (mountinfo polls "exceptional" once per
    # change).
    mountinfo = open("/proc/self/mountinfo", "rb")  # noqa: SIM115 - lives as long as we do
    # A spare that died unused is not replaced until the next launch: on a host where every
    # pid 1 dies at once, the zygote would otherwise make them in a loop.
    spare_died = False

    def drop_prepared() -> None:
        nonlocal template
        for spare in [*prepared, *([template] if template is not None else [])]:
            spare.close()
        prepared.clear()
        template = None

    def launch_fresh(launch: list[int], reply: int, mode: bytes) -> None:
        """Hand a launch a skeleton that builds its own view."""
        nonlocal ready
        if ready is not None and not _alive(ready):
            ready.close()
            ready = None
        if mode == PRODUCTION and ready is not None:
            skeleton, ready = ready, None
        else:
            skeleton = start(Shape.decode(mode))
        _hand_over(skeleton, launch, reply)
        mounting.append(skeleton.handoff)

    def keep_promise(spare: _Prepared, launch: list[int], reply: int, identity: bytes,
                     fresh: bool) -> None:
        """The promised spare said it is ready (or ended): the launch gets it if it fits,
        else (or when the host's mounts changed: `fresh`) a skeleton of its own."""
        if not fresh and spare.read() and spare.identity == identity:
            _hand_over(spare.skeleton, launch, reply)
            spare.sock.close()
        else:
            spare.close()
            launch_fresh(launch, reply, PRODUCTION)

    while True:
        # Spares are made while no sandbox is building its mounts: both need the kernel's
        # mount-namespace lock, and a launch should not queue behind a spare. The prepared
        # ones first: a run of launches with one view then uses one spare each.
        if not mounting:
            if wanted is not None and (template is None or template.view != wanted):
                drop_prepared()
                try:
                    template = _Template(wanted)
                except (StockadeError, OSError):  # (no namespaces here: launches say why)
                    wanted = None
            if len(prepared) < PREPARED and template is not None and template.identity:
                spare = template.spare()
                if spare is None:  # the template is gone: do not try again for now
                    drop_prepared()
                    wanted = None
                else:
                    prepared.append(spare)
            elif ready is None and not spare_died:
                ready = start()
        watched = [control, *mounting, *(p.sock for p in prepared if p.identity is None),
                   *(p[0].sock for p in promised)] \
            + ([template.sock] if template is not None and template.identity is None else []) \
            + ([ready.pidfd] if ready is not None and ready.pidfd is not None else [])
        readable, _, changed = select.select(watched, [], [mountinfo])
        if ready is not None and ready.pidfd in readable:  # its pid 1 died unused
            readable.remove(ready.pidfd)
            ready.close()
            ready, spare_died = None, True
        if changed:
            drop_prepared()
            if ready is not None:
                ready.close()
                ready = None
        for promise in [p for p in promised if changed or p[0].sock in readable]:
            promised.remove(promise)
            keep_promise(*promise, fresh=bool(changed))
        if changed:
            continue
        for sock in readable:
            if sock.fileno() < 0:
                continue  # (a promised spare's, handed over or closed above)
            if sock is not control and sock not in mounting:
                spares = [p for p in prepared if p.sock is sock]
                if spares and not spares[0].read() \
                        or template is not None and sock is template.sock and not template.read():
                    drop_prepared()  # it could not be prepared: do not try again for now
                    wanted = None
                continue  # (or a spare handed over or thrown away earlier in this round)
            if sock is not control:
                mounting.remove(sock)
                sock.close()  # it said "mounted", or it is gone
                continue
            kind, fds = recv_fds(control, _FDS_PER_LAUNCH, size=2 + _IDENTITY + VIEW_MAX)
            if not kind:
                os._exit(0)  # the owner is gone
            if len(fds) != _FDS_PER_LAUNCH:
                close_all(fds)
                continue
            *launch, reply = fds
            spare_died = False
            mode, identity, view = _parse(kind)
            if mode == LANDLOCK_TIER:
                _keep(launch, reply)
                continue
            usable = mode == PRODUCTION and view
            fitting = [p for p in prepared if p.fits(view, identity)] if usable else []
            if fitting:
                prepared.remove(fitting[0])
                _hand_over(fitting[0].skeleton, launch, reply)
                fitting[0].sock.close()
                wanted = view
                continue
            # A spare of this view still making itself ready (about a millisecond) is
            # promised to the launch rather than build a view on the launch's time.
            coming = [p for p in prepared if p.identity is None and p.view == view] \
                if usable and template is not None and template.identity == identity else []
            if coming:
                prepared.remove(coming[0])
                promised.append((coming[0], launch, reply, identity))
                wanted = view
                continue
            if usable and template is None:
                wanted = view
            elif usable and (template.view != view or template.identity and identity
                             and template.identity != identity):
                # Another view; or the host changed under this one since its template was
                # made, and then no next spare is prepared (the host may change at every
                # launch).
                wanted = view if template.view != view else None
                drop_prepared()
            launch_fresh(launch, reply, mode)


def _keep(launch: list[int], reply: int) -> None:
    """A landlock-tier launch: fork its keeper, give the owner a pidfd of it."""
    from stockade.linux import landlock_tier

    with socket.socket(fileno=reply) as answer:
        try:
            pidfd = landlock_tier.start(launch)
        except (StockadeError, OSError):
            return  # (the owner reports that no launcher started)
        finally:
            close_all(launch)
        try:
            send_fds(answer, b"P", [pidfd])
        except OSError:
            pass  # the owner stopped waiting; the keeper sees its lifeline close
        finally:
            os.close(pidfd)


def _alive(skeleton: Skeleton) -> bool:
    """Whether a skeleton's pid 1 still runs (a stand-in always does until its launch)."""
    return skeleton.pidfd is None or not select.select([skeleton.pidfd], [], [], 0)[0]


def _parse(message: bytes) -> tuple[bytes, bytes, bytes]:
    """(mode, identity or b"", view frame or b"") of a launch message from the owner."""
    mode, flag = message[:1], message[1:2]
    if flag == _SURVEYED and len(message) >= 2 + _IDENTITY:
        return mode, message[2:2 + _IDENTITY], message[2 + _IDENTITY:]
    return mode, b"", message[2:] if flag == _UNSURVEYED else b""


def _hand_over(skeleton: Skeleton, launch: list[int], reply: int) -> None:
    """Give the launch's descriptors to the skeleton's pid 1 and its pidfd to the owner."""
    with socket.socket(fileno=reply) as answer:
        if skeleton.pidfd is None:  # a stand-in's; empty if it died: the owner reports it
            _, pidfds = recv_fds(skeleton.handoff, 1)
        else:
            pidfds = [skeleton.pidfd]
        try:
            send_fds(skeleton.handoff, b"G", launch)
            if len(pidfds) == 1:
                send_fds(answer, b"P", pidfds)
        except OSError:
            pass  # the owner stopped waiting; the sandbox sees its lifeline close
        finally:
            close_all(launch + pidfds)
