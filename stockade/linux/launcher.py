"""The skeleton of one sandbox: started by the zygote *before* it is needed, so that making
namespaces and the sandbox's pid 1 are off a launch's critical path.

One clone(2) makes pid 1 inside fresh namespaces (see start); it waits on the handoff socket
for one launch's descriptors: stdin, stdout, stderr, the request pipe (also the owner's
lifeline), the status pipe and a control socket (to pass the proxy's listener out). The owner
watches pid 1 through a pidfd: pid 1 exits only after the kernel has killed and reaped
everything else in its pid namespace, so its exit means the whole sandbox has drained.

The request pipe carries one frame (frame.py). Before the launch, the zygote may send pid 1 a
view frame to prepare the sandbox for: pid 1 then builds its mounts, confines itself and
becomes the supervisor ahead of demand (see init.py).
"""

from __future__ import annotations

import os
import signal
import socket
from dataclasses import dataclass
from typing import NoReturn

from stockade.linux.frame import LAUNCH_FDS
from stockade.linux.syscalls import prctl

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Shape:
    """What a skeleton is made with: production skeletons have every namespace and close every
    descriptor the launching process had; the other shapes exist for tests that weaken those
    layers, and are always made at launch (never prepared ahead)."""

    network: bool = True
    pid: bool = True
    close_fds: bool = True

    @classmethod
    def of(cls, weaken: frozenset[str]) -> Shape:
        return cls("network" not in weaken, "pid_namespace" not in weaken,
                   "descriptors" not in weaken)

    @property
    def production(self) -> bool:
        return self == Shape()

    def code(self) -> bytes:
        """One byte for the zygote: b"L" for production, a digit otherwise."""
        if self.production:
            return PRODUCTION
        return str((not self.network) | (not self.pid) << 1 | (not self.close_fds) << 2).encode()

    @classmethod
    def decode(cls, code: bytes) -> Shape:
        if code == PRODUCTION or not code.isdigit():
            return cls()
        bits = int(code)
        return cls(not bits & 1, not bits & 2, not bits & 4)


PRODUCTION = b"L"
PRODUCTION_SHAPE = Shape()


@dataclass
class Skeleton:
    """A sandbox before its launch: our end of its handoff socket and a pidfd of its pid 1;
    or, when its namespaces could not be made, no pidfd but the pid of a stand-in that sends a
    pidfd of itself ("I") and reports why to the launch that comes for it."""

    handoff: socket.socket
    pidfd: int | None
    standin: int = 0

    def close(self) -> None:
        """Throw it away: its pid 1 (or stand-in) sees the handoff close and exits."""
        self.handoff.close()
        if self.pidfd is not None:
            os.close(self.pidfd)


def start(shape: Shape = PRODUCTION_SHAPE) -> Skeleton:
    """Start a sandbox's pid 1 in fresh namespaces (ns.clone_sandbox), waiting on its handoff
    socket for a view to prepare or a launch (init.serve). Whatever goes wrong in the child,
    nothing is printed: its stderr is the owner's (the owner may simply have gone away), and
    the owner reports a typed failure."""
    from stockade.errors import StockadeError
    from stockade.linux import ns, privilege, supervisor

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    uid, gid = os.getuid(), os.getgid()  # (inside, unmapped, they read as the overflow ids)
    program = supervisor.descriptor()  # (loaded here, never by pid 1: see supervisor.py)
    try:
        pid, pidfd = ns.clone_sandbox(network=shape.network, pid_namespace=shape.pid)
    except StockadeError as exc:
        refusal = (exc.code, exc.message)
    except OSError as exc:
        refusal = ("setup_failed", exc.strerror or str(exc))
    else:
        if pid == 0:
            _die_with_parent()
            if shape.close_fds:
                privilege.close_fds({0, 1, 2, theirs.fileno(),
                                     -1 if program is None else program})
            _pid1(theirs, uid, gid, program, network=shape.network)
        theirs.close()
        return Skeleton(ours, pidfd)
    pid = os.fork()
    if pid == 0:
        privilege.close_fds({0, 1, 2, theirs.fileno()})
        _refuse(theirs, *refusal)
    theirs.close()
    return Skeleton(ours, None, pid)


def _die_with_parent() -> None:
    """The kernel kills this pid 1, and so its pid namespace, when what cloned it (the zygote,
    or the CLI) goes, whatever pid 1 is doing: one blocked, or stopped, acts on no lifeline.
    (Were the parent gone already, so would be the other end of the handoff socket: no launch
    could come.) The signal outlives the exec of the supervisor, which gains no privilege."""
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except BaseException:  # noqa: BLE001 - see start()
        os._exit(70)


def _pid1(handoff: socket.socket, uid: int, gid: int, program: int | None, *,
          network: bool) -> NoReturn:
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (the zygote ignores it)
        # A terminal's Ctrl-C is for the owner: when it dies, its sandboxes go with it. (The
        # supervisor starts the command with every signal at its default.)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from stockade.linux import init, net, ns

        try:
            ns.map_ids(uid, gid)
            if network:
                net.loopback_up()
        except OSError as exc:  # (a user namespace restricted by an LSM, for one)
            _refuse(handoff, "userns_unavailable", "the sandbox's new namespaces are unusable "
                    f"({exc.strerror or exc})", standin=False)
        init.serve(handoff, program)
    except BaseException:  # noqa: BLE001 - see start()
        os._exit(70)


def _refuse(handoff: socket.socket, code: str, message: str, *, standin: bool = True
            ) -> NoReturn:
    """The namespaces could not be made (or used): tell the launch that comes for this
    skeleton. A stand-in first sends a pidfd of itself; a pid 1 whose pidfd its starter holds
    does not."""
    try:
        from stockade.linux import fdpass, init

        if standin:
            fdpass.send_fds(handoff, b"I", [os.pidfd_open(os.getpid())])
        _, fds = fdpass.recv_fds(handoff, LAUNCH_FDS)
        if len(fds) == LAUNCH_FDS:
            init.emit(fds[4], event="error", kind="setup", code=code, message=message,
                      stage="namespaces")
    finally:
        os._exit(70)
