"""A view template: a process that builds one view once and clones each spare for that view
from itself, so that a run of launches with one policy does not build its mounts again and
again (see zygote.py).

The template lives in a user and a mount namespace of its own and nothing else: were it the
init of a pid namespace, its exit would kill every sandbox cloned from it. It builds the view
(mnt.build) and pivots into it, tells the zygote the survey's identity ("M"), and then, for
each "S" from the zygote, clones a spare: fresh user (nested in the template's), mount (a copy
of the template's, its mounts locked to the spare), pid, ipc, uts, net and cgroup namespaces.
The spare covers what each sandbox must own with fresh instances (mnt.refresh: proc, /tmp,
/dev/shm, /dev/pts), confines itself and becomes the supervisor, waiting for its launch as a
spare prepared by init.py would; it says "M" with the template's identity once it waits.

The template runs nothing untrusted and holds no launch's state. Two descriptors do what the
view cannot: the kernel lets a user namespace mount proc only where a fully visible proc is
mounted already, so the view's /proc is a proc of a pid namespace with nobody in it, which
each spare's own covers; and a spare cannot open a path before its ids are mapped, so the
template maps them through the host's proc, held open from before the pivot (never mounted in
any view). A spare writes its pid_max through that descriptor too, then closes it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from typing import NoReturn

from stockade.launch.request import LaunchRequest
from stockade.linux import fdpass, init, limits, mnt, net, ns, privilege, supervisor
from stockade.linux.launcher import Skeleton, parse_frame
from stockade.linux.mountapi import MOUNT_ATTR_NOEXEC, new_fs
from stockade.linux.syscalls import prctl

_TEMPLATE_NAMESPACES = ns.CLONE_NEWUSER | ns.CLONE_NEWNS
_libc = ctypes.CDLL(None, use_errno=True)


def start(view: bytes) -> Skeleton:
    """Start the template for a view frame; its handoff socket says "M" + identity once the
    view is built, or closes if it could not be."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    uid, gid = os.getuid(), os.getgid()
    program = supervisor.descriptor()
    pid, pidfd = ns.clone_sandbox(namespaces=_TEMPLATE_NAMESPACES)
    if pid == 0:
        try:
            privilege.close_fds({0, 1, 2, theirs.fileno(),
                                 -1 if program is None else program})
            _serve(theirs, view, uid, gid, program)
        finally:
            os._exit(0)
    theirs.close()
    return Skeleton(ours, pidfd)


def _serve(handoff: socket.socket, view: bytes, uid: int, gid: int, program: int | None
           ) -> NoReturn:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its spares are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ns.map_ids(uid, gid)  # (while it is dumpable: else its /proc files are not its own)
    prctl(init.PR_SET_DUMPABLE, 0)
    if program is None:
        os._exit(0)
    host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    raw, bpf, weaken, _ = parse_frame(view)
    request = LaunchRequest.decode(raw)
    protected, identity = mnt.build(request, init.STAGE, weaken, identify=True,
                                    proc=_empty_proc())
    mnt.freeze_own(request)
    handoff.send(b"M" + identity)
    while handoff.recv(1) == b"S":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        go, ready = os.pipe2(os.O_CLOEXEC)
        # The spare is born dumpable, so that its /proc files are its own until its ids are
        # mapped (by us, below); it is not dumpable from then on (the template likewise).
        prctl(init.PR_SET_DUMPABLE, 1)
        pid, pidfd = ns.clone_sandbox()
        if pid != 0:
            prctl(init.PR_SET_DUMPABLE, 0)
        if pid == 0:
            os.close(ready)
            ours.close()
            _spare(request, bpf, weaken, len(protected), view, identity, theirs, program,
                   host_proc, go)
        os.close(go)
        theirs.close()
        try:
            ns.map_ids(uid, gid, str(pid), proc=host_proc)
            os.write(ready, b"g")
        finally:
            os.close(ready)
        fdpass.send_fds(handoff, b"S", [ours.fileno(), pidfd])
        ours.close()
        os.close(pidfd)
    os._exit(0)


def _spare(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], protected: int,
           view: bytes, identity: bytes, handoff: socket.socket, program: int,
           host_proc: int, go: int) -> NoReturn:
    """Body of a spare (pid 1 of its namespaces) until it becomes the supervisor. Whatever
    fails, it just ends: the zygote then hands no launch to it."""
    try:
        privilege.close_fds({0, 1, 2, handoff.fileno(), program, host_proc, go})
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if os.read(go, 1) != b"g":
            os._exit(0)
        os.close(go)
        init.settle_as_pid1()
        net.loopback_up()
        mnt.refresh(request)
        pid_max = limits.cap_pid_namespace(request.limits, proc=host_proc)
        os.close(host_proc)
        listener = init.listener_for(request)
        plan = init.seal(request, bpf, weaken, protected, pid_max, view, b"")
        handoff.send(b"M" + identity)
        supervisor.become(program, plan, listener, handoff=handoff.fileno())
    except BaseException:  # noqa: BLE001 - see above
        os._exit(0)


def _empty_proc() -> int:
    """A detached proc of a pid namespace with nobody left in it (its init made it and
    exited), read-only like the sandbox's own."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    helper = os.fork()
    if helper == 0:
        try:
            if _libc.unshare(ns.CLONE_NEWPID) != 0:
                os._exit(1)
            init_pid = os.fork()  # pid 1 of the new pid namespace
            if init_pid == 0:
                fdpass.send_fds(theirs, b"P", [new_fs("proc", {}, mnt.RO | MOUNT_ATTR_NOEXEC)])
                os._exit(0)
            os.waitpid(init_pid, 0)
        finally:
            os._exit(0)
    theirs.close()
    try:
        _, fds = fdpass.recv_fds(ours, 1)
    finally:
        ours.close()
    if len(fds) != 1:
        raise OSError("the empty pid namespace's proc could not be made")
    return fds[0]
