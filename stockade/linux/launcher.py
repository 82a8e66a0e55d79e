"""The skeleton of one sandbox: started by the zygote *before* it is needed, so that making
namespaces and the sandbox's pid 1 are off a launch's critical path.

One clone(2) makes pid 1 inside fresh namespaces (see start); it waits on the handoff socket
for one launch's descriptors: stdin, stdout, stderr, the request pipe (also the owner's
lifeline), the status pipe and a control socket (to pass the proxy's listener out). The owner
watches pid 1 through a pidfd: pid 1 exits only after the kernel has killed and reaped
everything else in its pid namespace, so its exit means the whole sandbox has drained.

The request pipe carries one frame of length-prefixed parts: the LaunchRequest, the compiled
seccomp program, the weakenings (see WEAKENINGS), and the launch part (see encode_launch), which
the supervisor reads (supervisor.c). Before the launch, the zygote may send pid 1 a view frame
(see view_frame) to prepare the sandbox for: pid 1 then builds its mounts, confines itself and
becomes the supervisor ahead of demand (see init.py).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import struct
from dataclasses import dataclass
from typing import NoReturn

from stockade.launch.request import LaunchRequest

# Layers a test can switch off to prove that the evidence matrix notices (never set in
# production: only the owner's Python code can pass them, through LinuxBackend(weaken=...)).
# Each evidence row names the ones that make it fail (stockade/evidence/rows.py).
LAYERS = {
    "mount_view": "the fresh root: without it the sandbox keeps a copy of the host's mounts, "
                  "and nothing of the view (read-only roots, masks, noexec, nosuid, its own "
                  "/tmp and /dev) is made",
    "read_only": "read roots mounted read-only",
    "protected": "protected names and repositories re-mounted read-only",
    "deny": "denied paths masked",
    "noexec": "write roots, /tmp and /dev/shm mounted noexec",
    "nosuid": "roots, /tmp and /dev/shm mounted nosuid",
    "stockade_state": "Stockade's state directories masked",
    "unix_sockets": "unix socket files in write roots masked",
    "landlock": "the Landlock ruleset",
    "seccomp": "the seccomp filters (Stockade's deny list, and the command's watches)",
    "exec_watch": "pid 1 refuses the command's executable mappings of written files "
                  "(seccomp user notification, where exec_from_write = false)",
    "privileges": "securebits, capabilities dropped, no_new_privs",
    "network": "the network namespace",
    "pid_namespace": "the pid namespace (and with it the kernel's kill of the whole tree)",
    "descriptors": "descriptors the launching process left inheritable closed",
    "environment": "the closed environment (the command gets the launching process's)",
    "rlimits": "the rlimits",
    "pid_max": "pid_max of the sandbox's pid namespace",
    "memfd_noexec": "vm.memfd_noexec = 2 in the sandbox's pid namespace",
    "lifeline": "pid 1 ends when its owner goes away or kills it",
    "timeout": "the owner ends the sandbox at limits.timeout",
    "output_cap": "the owner captures at most limits.output",
    "proxy_rules": "the allowlist proxy's name and port patterns",
    "proxy_addresses": "the allowlist proxy's checks of the addresses a name resolves to",
    # Not the sandbox's own, but its helpers' (the evidence rows that attack Stockade's servers
    # and the caller's streams read them).
    "peer_check": "the daemon's and the CLI server's refusal of peers in another context",
    "stdio_relay": "the caller's streams relayed through pipes",
}
WEAKENINGS = frozenset(LAYERS)
# Layers that go with another: without the fresh root nothing of the view is made (and the
# write roots are no mounts of their own for the exec watch to tell); without a pid namespace
# of its own, the sandbox has none of its knobs.
WITH = {
    "mount_view": frozenset({"read_only", "protected", "deny", "noexec", "nosuid",
                             "stockade_state", "unix_sockets", "exec_watch"}),
    "pid_namespace": frozenset({"pid_max", "memfd_noexec"}),
}


def switched_off(weaken: frozenset[str]) -> frozenset[str]:
    """Every layer that is off when `weaken` is."""
    return weaken.union(*(WITH.get(layer, frozenset()) for layer in weaken))


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
LAUNCH_FDS = 6  # stdin, stdout, stderr, request pipe, status pipe, control socket
VIEW_MAX = 60000  # bytes: a larger view frame is not prepared ahead (it travels in one message)


_HEADER = struct.Struct("<IIII")  # lengths: request, seccomp program, weakenings, launch
_LAUNCH = struct.Struct("<III")  # umask, argc, envc (after the view frame's digest)


def read_frame(fd: int) -> bytes:
    """One whole frame from `fd`."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("request frame truncated")
            data += chunk
        return data
    header = exactly(_HEADER.size)
    return header + exactly(sum(_HEADER.unpack(header)))


def parse_frame(frame: bytes) -> tuple[bytes, bytes, frozenset[str], bytes]:
    """(request, seccomp program, weakenings, launch part) from a frame."""
    if len(frame) < _HEADER.size:
        raise EOFError("request frame truncated")
    lengths = _HEADER.unpack_from(frame)
    if len(frame) != _HEADER.size + sum(lengths):
        raise EOFError("request frame truncated")
    parts, at = [], _HEADER.size
    for length in lengths:
        parts.append(frame[at:at + length])
        at += length
    request, bpf, weak, launch = parts
    weaken = frozenset(weak.decode().split(",")) - {""}
    return request, bpf, weaken & WEAKENINGS, launch


def encode_frame(request: bytes, bpf: bytes, weaken: frozenset[str], launch: bytes) -> bytes:
    """The frame: the request, the seccomp program, the weakenings and the launch part."""
    weak = ",".join(sorted(weaken)).encode()
    return (_HEADER.pack(len(request), len(bpf), len(weak), len(launch)) + request + bpf + weak
            + launch)


def encode_launch(request: LaunchRequest, umask: int, view: bytes | None) -> bytes:
    """What the supervisor starts the command with: the digest of the launch's view frame
    (a spare checks it was made for that view; zeros when none was computed), the owner's
    umask at launch (the command's: a zygote or a spare may have been made under another),
    then the working directory, argv and `NAME=VALUE` per variable, each NUL-ended (none
    can hold a NUL: see compile.py)."""
    strings = [request.cwd, *request.argv, *(f"{name}={value}" for name, value in request.env)]
    return b"".join([hashlib.sha256(view).digest() if view is not None else bytes(32),
                     _LAUNCH.pack(umask, len(request.argv), len(request.env)),
                     *(os.fsencode(text) + b"\0" for text in strings)])


def view_frame(request: LaunchRequest, bpf: bytes, weaken: frozenset[str]) -> bytes:
    """The frame of what shapes the sandbox itself (roots, protected names, network, limits,
    seccomp, weakenings) without what is one launch's own (argv, environment, working
    directory, umask, id). A spare whose mounts and confinement were made from a view frame
    is used only by a launch whose own view frame is the same bytes."""
    view = request.encode(argv=["-"], cwd="/", env=[], stdin="null", request_id="")
    return encode_frame(view, bpf, weaken, b"")


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
