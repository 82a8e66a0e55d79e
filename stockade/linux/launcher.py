"""The skeleton of one sandbox: forked by the zygote *before* it is needed, so that entering
namespaces and forking the sandbox's pid 1 are off a launch's critical path.

The skeleton process enters fresh namespaces and forks pid 1, which waits on the handoff socket
for one launch's descriptors: stdin, stdout, stderr, the request pipe (also the owner's
lifeline), the status pipe and a control socket (to pass the proxy's listener out). The owner
watches pid 1 through a pidfd: pid 1 exits only after the kernel has killed and reaped
everything else in its pid namespace, so its exit means the whole sandbox has drained.

The request pipe carries one frame: the LaunchRequest, the compiled seccomp program and the
weakenings (see WEAKENINGS) as length-prefixed parts, and the owner's umask. Before the launch,
the zygote may send pid 1 a view frame (see view_frame) to prepare the sandbox for: pid 1 then
builds its mounts and has the command's process confined ahead of demand (see init.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import struct
from typing import NoReturn

from stockade.launch.request import LaunchRequest

# Layers a test can switch off to prove the evidence matrix notices (never set in production:
# only the owner's Python code can pass them, through LinuxBackend(weaken=...)).
WEAKENINGS = frozenset({"seccomp", "landlock", "privileges", "read_only", "protected", "deny",
                        "network", "rlimits"})
LAUNCH_FDS = 6  # stdin, stdout, stderr, request pipe, status pipe, control socket
VIEW_MAX = 60000  # bytes: a larger view frame is not prepared ahead (it travels in one message)


_HEADER = struct.Struct("<IIII")  # request, seccomp program and weakenings lengths; umask


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
    request_len, bpf_len, weak_len, _ = _HEADER.unpack(header)
    return header + exactly(request_len + bpf_len + weak_len)


def parse_frame(frame: bytes) -> tuple[bytes, bytes, frozenset[str], int]:
    """(request, seccomp program, weakenings, umask) from a frame of length-prefixed parts."""
    if len(frame) < _HEADER.size:
        raise EOFError("request frame truncated")
    request_len, bpf_len, weak_len, umask = _HEADER.unpack_from(frame)
    body = memoryview(frame)[_HEADER.size:]
    if len(body) != request_len + bpf_len + weak_len:
        raise EOFError("request frame truncated")
    request, bpf = bytes(body[:request_len]), bytes(body[request_len:request_len + bpf_len])
    weaken = frozenset(bytes(body[request_len + bpf_len:]).decode().split(",")) - {""}
    return request, bpf, weaken & WEAKENINGS, umask & 0o777


def encode_frame(request: bytes, bpf: bytes, weaken: frozenset[str], umask: int) -> bytes:
    """The frame: the request, the seccomp program, the weakenings, and the owner's umask at
    launch (the command's: a zygote or a prepared skeleton may have been made under another)."""
    weak = ",".join(sorted(weaken)).encode()
    return _HEADER.pack(len(request), len(bpf), len(weak), umask) + request + bpf + weak


def view_frame(request: LaunchRequest, bpf: bytes, weaken: frozenset[str]) -> bytes:
    """The frame of what shapes the sandbox itself (roots, protected names, network, limits,
    seccomp, weakenings) without what is one launch's own (argv, environment, working
    directory, umask, id). A spare whose mounts and confinement were made from a view frame
    is used only by a launch whose own view frame is the same bytes."""
    view = dataclasses.replace(request, argv=("-",), cwd="/", env=(), stdin="null",
                               request_id="")
    return encode_frame(view.encode(), bpf, weaken, 0)


def skeleton(handoff: socket.socket, *, network: bool) -> NoReturn:
    """Body of the skeleton process (forked by the zygote); never returns.

    It enters the namespaces, forks pid 1, sends the zygote a pidfd of it over the handoff
    socket, and exits: pid 1 is adopted by the zygote (a subreaper). When the namespaces
    cannot be made, it stays instead, to report that to the launch that comes for it, and
    sends a pidfd of itself. Whatever goes wrong, nothing is printed: its stderr is the
    owner's (the owner may simply have gone away), and the owner reports a typed failure."""
    try:
        _skeleton(handoff, network=network)
    except BaseException:  # noqa: BLE001 - see above
        os._exit(70)


def _skeleton(handoff: socket.socket, *, network: bool) -> NoReturn:
    from stockade.errors import StockadeError
    from stockade.linux import fdpass, net, ns

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # A terminal's Ctrl-C is for the owner: when it dies, its sandboxes go with it. The
    # command's process restores the default before exec.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ns.unshare_all(network=network)
        if network:
            net.loopback_up()
        pid = os.fork()
    except StockadeError as exc:
        _refuse(handoff, exc.code, exc.message)
    except OSError as exc:
        _refuse(handoff, "setup_failed", exc.strerror or str(exc))
    if pid == 0:
        from stockade.linux import init
        init.serve(handoff)
    pidfd = os.pidfd_open(pid)
    fdpass.send_fds(handoff, b"I", [pidfd])
    os._exit(0)


def _refuse(handoff: socket.socket, code: str, message: str) -> NoReturn:
    """The namespaces could not be made: tell the launch that comes for this skeleton."""
    from stockade.linux import fdpass, init

    fdpass.send_fds(handoff, b"I", [os.pidfd_open(os.getpid())])
    _, fds = fdpass.recv_fds(handoff, LAUNCH_FDS)
    if len(fds) == LAUNCH_FDS:
        init.emit(fds[4], event="error", kind="setup", code=code, message=message,
                  stage="namespaces")
    os._exit(70)
