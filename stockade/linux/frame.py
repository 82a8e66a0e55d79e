"""The request pipe's frame, read by a sandbox's pid 1 (init.py) and its supervisor
(supervisor.c): length-prefixed parts, the LaunchRequest, the compiled seccomp program, the
weakenings (WEAKENINGS) and the launch part (encode_launch); and the view frame (view_frame),
what a spare sandbox is prepared for ahead of its launch (launcher.py, zygote.py).
"""

from __future__ import annotations

import hashlib
import os
import struct

from stockade.launch.request import LaunchRequest
from stockade.linux.mnt import hidden_cwd

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
    "deny_links": "every other name (a hard link) of a denied file masked where the write "
                  "roots' walk meets it (the landlock tier: given no rule), and a launch "
                  "refused where one lies out of its reach",
    "pins": "every directory between a write root and what the view re-mounts or masks in it "
            "pinned (a mount point: no rename or rmdir carries a mask away)",
    "noexec": "write roots, /tmp and /dev/shm mounted noexec",
    "nosuid": "roots, /tmp and /dev/shm mounted nosuid",
    "stockade_state": "Stockade's state directories masked",
    "host_code": "the code the host runs next (Stockade's install, the interpreter, its import "
                 "path) made read-only where it lies in a write root (the landlock tier: a "
                 "launch with such a root refused)",
    "overlay": "write roots mounted as overlays (filesystem.workspace = \"overlay\"): "
               "without it they are mounted directly, and the command writes the real "
               "workspace",
    "unix_sockets": "unix socket files in write roots masked",
    "landlock": "the Landlock ruleset",
    "seccomp": "the seccomp filters (Stockade's deny list, and the command's watches)",
    "exec_watch": "pid 1 refuses the command's executable mappings and executions of "
                  "written files, memfds and deleted files (seccomp user notification, where "
                  "exec_from_write = false)",
    "memfd_seal": "pid 1 makes the command's memfds itself, sealed non-executable (seccomp "
                  "user notification, where exec_from_write = false)",
    "names_watch": "pid 1 makes the names the command makes, and refuses protected ones in "
                   "write roots (seccomp user notification)",
    "proc_guard": "pid 1 makes no lookup inside another process's /proc/<pid> for the "
                  "command (its own /proc/1: its status pipe, its lifeline, its memory)",
    "privileges": "securebits, capabilities dropped, no_new_privs",
    "network": "the network namespace",
    "pid_namespace": "the pid namespace (and with it the kernel's kill of the whole tree)",
    "descriptors": "descriptors the launching process left inheritable closed",
    "environment": "the closed environment (the command gets the launching process's)",
    "rlimits": "the rlimits",
    "pid_max": "pid_max of the sandbox's pid namespace",
    "memfd_noexec": "vm.memfd_noexec = 2 in the sandbox's pid namespace",
    "pid_scope": "the landlock tier's refusal of every call that acts on another process by "
                 "pid (limits, priority, affinity, scheduling, I/O priority, kcmp): the "
                 "keeper and the host's processes among them",
    "xattr": "the landlock tier's refusal of every extended attribute set or removed",
    "world_write": "the landlock tier's refusal of a mode that lets other users write (chmod "
                   "and its kin)",
    "inotify": "the landlock tier's refusal of inotify (a watch outside the roots would tell "
               "of the host's activity there)",
    "lifeline": "pid 1 (the landlock tier's keeper) ends when its owner goes away or kills it",
    "tree_kill": "the landlock tier's keeper kills every descendant once the command exits",
    "timeout": "the owner ends the sandbox at limits.timeout",
    "output_cap": "the owner captures at most limits.output",
    "proxy_rules": "the allowlist proxy's name and port patterns",
    "proxy_addresses": "the allowlist proxy's checks of the addresses a name resolves to",
    "proxy_credentials": "the allowlist proxy's refusal of a request that carries a "
                         "credential's placeholder (or its secret) to another host, in its "
                         "host name, its head or its body",
    "proxy_http": "network.http's methods and paths, in the allowlist proxy",
    "proxy_framing": "the allowlist proxy's refusal of a request it reads whose framing is "
                     "ambiguous (Content-Length beside Transfer-Encoding, differing lengths, "
                     "another transfer coding)",
    "address_guard": "network any's destination guard (nftables in the sandbox's namespace)",
    "inbound_guard": "network any's input filter: only replies to what the sandbox sent (the "
                     "connection tracking of its namespace) get in",
    "source_ports": "network any's UDP source ports remapped into the host's ephemeral range "
                    "(so the sandbox cannot choose the host port pasta binds for it)",
    "usernet_isolation": "network any's user-mode networking kept from the host's loopback "
                         "(pasta's port forwarding and gateway mapping off)",
    # Not the sandbox's own, but its helpers' (the evidence rows that attack Stockade's servers
    # and the caller's streams read them).
    "peer_check": "the daemon's and the CLI server's refusal of peers in another context",
    "server_check": "the CLI's and the session clients' check of who listens on a server's "
                    "socket before they send anything",
    "change_store_check": "the change sets' store trusted only when it is the user's alone and "
                          "a set's `created` is not in the future",
    "change_seal": "`apply` acts on a change set only when its seal (an HMAC under the user's "
                   "key of the roots, protections and baseline its run was granted) verifies",
    "change_seal_key": "`apply` verifies a seal only under the key where the password database "
                       "says (never one in the state directory beside the sets, which a sandbox "
                       "may have built whole where another environment looks for it)",
    "stdio_relay": "the caller's streams relayed through pipes",
    "review_escape": "the copy-on-write review (`stockade changes`, diff()) escapes the "
                     "control characters of names and contents",
}
WEAKENINGS = frozenset(LAYERS)
# Layers that go with another: without the fresh root nothing of the view is made (and the
# write roots are no mounts of their own for the exec watch to tell); without a pid namespace
# of its own, the sandbox has none of its knobs.
WITH = {
    "mount_view": frozenset({"read_only", "protected", "deny", "deny_links", "pins", "noexec",
                             "nosuid", "stockade_state", "host_code", "unix_sockets",
                             "exec_watch", "overlay"}),
    "pid_namespace": frozenset({"pid_max", "memfd_noexec"}),
}


# In the landlock tier, the rules that refuse sockets, acts on other processes, extended
# attributes, world-writable modes and inotify are part of its seccomp filter.
TIER_WITH = {"seccomp": frozenset({"network", "unix_sockets", "pid_scope", "xattr",
                                   "world_write", "inotify"})}


def switched_off(weaken: frozenset[str], isolation: str = "namespaces") -> frozenset[str]:
    """Every layer that is off when `weaken` is, in `isolation`."""
    goes_with = WITH if isolation == "namespaces" else TIER_WITH
    return weaken.union(*(goes_with.get(layer, frozenset()) for layer in weaken))
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
    directory, umask, id); the working directory is in it when the view mounts it (see
    mnt.hidden_cwd). A spare whose mounts and confinement were made from a view frame
    is used only by a launch whose own view frame is the same bytes."""
    cwd = request.cwd if hidden_cwd(request) else "/"
    view = request.encode(argv=["-"], cwd=cwd, env=[], stdin="null", request_id="")
    return encode_frame(view, bpf, weaken, b"")
