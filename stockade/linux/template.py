"""A view template: a process that builds one view once and clones each spare for that view
from itself, so that a run of launches with one policy does not build its mounts again and
again (see zygote.py).

The template lives in a user and a mount namespace of its own and nothing else: were it the
init of a pid namespace, its exit would kill every sandbox cloned from it. In Python, it builds
the view (mnt.build), pivots into it, and computes once what every spare of the view needs:
the supervisor's plan, and a spec (`_spec`: the filesystems to cover, what to carry onto /tmp,
the Landlock ruleset, the seccomp program, pid_max). It tells the zygote the survey's identity
("M") and execs the supervisor as a template (template.c), in the same namespaces and view.

From then on it is a compiled process of a few pages. For each "S" from the zygote it clones a
spare: fresh user (nested in the template's), mount (a copy of the template's, its mounts
locked to the spare), pid, ipc, uts, net and cgroup namespaces. The spare covers what each
sandbox must own with fresh instances (refresh.c: proc, /tmp, /dev/shm, /dev/pts, and what lay
below the template's /tmp carried over), confines itself as init.py's pid 1 does (confine.c),
says "M" with the template's identity and waits for its launch as the supervisor, as a spare
prepared by init.py would. No Python runs in a spare, and none is copied into it.

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
import struct
from typing import NoReturn

from stockade.launch.request import LaunchRequest
from stockade.linux import fdpass, init, landlock, limits, mnt, ns, privilege, supervisor
from stockade.linux.frame import parse_frame
from stockade.linux.launcher import Skeleton
from stockade.linux.mountapi import MOUNT_ATTR_NOEXEC, new_fs
from stockade.linux.syscalls import prctl
from stockade.net.env import SANDBOX_PORT

_TEMPLATE_NAMESPACES = ns.CLONE_NEWUSER | ns.CLONE_NEWNS
# template.c's spec: the layers a spare applies (unless weakened for a test), a listener flag,
# and the kinds of what it carries onto its /tmp
_LAYERS = {"landlock": 1, "privileges": 2, "seccomp": 4}
_PROXY_LISTENER = 8
_MEMFD_NOEXEC = 16
_DIRECTORY, _LINK, _MOUNT = 0, 1, 2
_U32 = struct.Struct("<I")
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
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its helpers are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ns.map_ids(uid, gid)  # (while it is dumpable: else its /proc files are not its own)
    prctl(init.PR_SET_DUMPABLE, 0)
    if program is None:
        os._exit(0)
    host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    raw, bpf, weaken, _ = parse_frame(view)
    request = LaunchRequest.decode(raw)
    knobs = limits.pid_knobs(request, weaken)  # (while /proc is still the host's)
    protected, identity = mnt.build(request, init.STAGE, weaken, identify=True,
                                    proc=_empty_proc())
    mnt.freeze_own(request)
    plan = init.plan_for(request, weaken, len(protected), knobs, view, b"")
    spec = supervisor.memfd("stockade-template", _spec(request, bpf, weaken, uid, gid,
                                                         knobs, identity))
    handoff.send(b"M" + identity)
    supervisor.become_template(program, spec, plan, handoff.fileno(), host_proc)


def _spec(request: LaunchRequest, bpf: bytes, weaken: frozenset[str], uid: int, gid: int,
          knobs: limits.PidKnobs, identity: bytes) -> bytes:
    """What template.c makes each spare from (read by its parse_spec, in this order): which
    layers and whether a proxy listener, the ids to map, pid_max, the identity to say, the
    seccomp program, the filesystems to cover, what to carry onto /tmp, and the Landlock
    ruleset, all as the sandbox sees them once its view is built."""
    flags = sum(bit for name, bit in _LAYERS.items() if name not in weaken)
    if request.network.mode == "allowlist":
        flags |= _PROXY_LISTENER
    if knobs.memfd_noexec:
        flags |= _MEMFD_NOEXEC
    out = [struct.pack("<IIIIq", flags, uid, gid, SANDBOX_PORT,
                       -1 if knobs.pid_max is None else knobs.pid_max), _blob(identity),
           _blob(bpf)]
    own = mnt.own_filesystems(request, weaken)
    out.append(_U32.pack(len(own)))
    for fs in own:
        out += [_text(fs.path), _text(fs.fstype), struct.pack("<qI", fs.attrs, len(fs.options))]
        out += [_text(word) for pair in fs.options.items() for word in pair]
    carried = mnt.carried_below_tmp(request)
    out.append(_U32.pack(len(carried)))
    for item in carried:
        kind = _MOUNT if item.mount else _DIRECTORY if item.link is None else _LINK
        out += [_U32.pack(kind), _text(item.path), _text(item.link or "")]
    made = (landlock.ruleset(init.landlock_rules(request)) if flags & _LAYERS["landlock"]
            else landlock.Ruleset(0, 0, 0, 0, (), ()))
    out += [struct.pack("<qqqI", made.handled_fs, made.handled_net, made.scoped,
                        len(made.grants))]
    out += [_text(path) + struct.pack("<q", access) for path, access in made.grants]
    out.append(_U32.pack(len(made.tcp_connect_ports)))
    out += [struct.pack("<q", port) for port in made.tcp_connect_ports]
    return b"".join(out)


def _blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _text(text: str) -> bytes:
    return _blob(os.fsencode(text)) + b"\0"


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
