"""The zygote: one launcher interpreter per owner process, forking a fresh launcher per launch.

Starting an interpreter and importing the launcher costs tens of milliseconds; forking a warm,
single-threaded one costs well under one. The owner (any thread, any event loop) sends each
launch's descriptors over a socket — stdin, stdout, stderr, the request pipe, the status pipe and
a reply socket — and gets back a pidfd of that launch's launcher. The zygote itself never enters
a namespace and closes each launch's descriptors right after forking, so no launcher, and nothing
untrusted, ever runs in a process that holds another launch's state. It exits when its owner's
end of the socket closes, i.e. when the owner exits or dies.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import subprocess
import sys
import threading

from stockade.errors import SetupError

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# -I -S: no environment, no site-packages, no current directory on sys.path; only Stockade.
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from stockade.linux.zygote import serve; serve(int(sys.argv[2]))")
_FDS_PER_LAUNCH = 6  # stdin, stdout, stderr, request pipe, status pipe, reply socket


def _send_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _recv_fds(sock: socket.socket, count: int) -> tuple[bytes, list[int]]:
    data, ancdata, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(count * 4))
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


class Zygote:
    """The owner's side: starts the zygote on first use, restarts it if it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def launch(self, stdio: tuple[int, int, int], request_r: int, status_w: int) -> int:
        """Fork a launcher with these descriptors; returns a pidfd for it."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [*stdio, request_r, status_w, theirs.fileno()]
            with self._lock:
                try:
                    _send_fds(self._connected(), b"L", fds)
                except OSError:
                    self._stop()  # it died: one fresh start, then give up
                    _send_fds(self._connected(), b"L", fds)
            theirs.close()
            _, received = _recv_fds(mine, 1)
        finally:
            theirs.close()
            mine.close()
        if len(received) != 1:
            for fd in received:
                os.close(fd)
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


ZYGOTE = Zygote()


def serve(control_fd: int) -> None:
    """The zygote's main loop (runs in its own interpreter)."""
    # Everything a launcher needs is imported here, once, before any fork.
    from stockade.launch import request  # noqa: F401
    from stockade.linux import init, launcher, ns  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # launchers are reaped by the kernel
    control = socket.socket(fileno=control_fd)
    while True:
        data, fds = _recv_fds(control, _FDS_PER_LAUNCH)
        if not data:
            os._exit(0)  # the owner is gone
        if len(fds) != _FDS_PER_LAUNCH:
            for fd in fds:
                os.close(fd)
            continue
        *stdio, request_r, status_w, reply = fds
        pid = os.fork()
        if pid == 0:
            control.close()
            os.close(reply)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            for fd in stdio:
                os.close(fd)
            launcher.main(request_r, status_w)
        pidfd = os.pidfd_open(pid)
        with socket.socket(fileno=reply) as answer:
            try:
                _send_fds(answer, b"P", [pidfd])
            except OSError:
                pass  # the owner stopped waiting; the launcher sees its lifeline close
        for fd in (*stdio, request_r, status_w, pidfd):
            os.close(fd)
