"""The Linux backend's rows of the enforcement report (stockade/launch/report.py), computed
from the facts the Linux readiness probe verified (probe.py), from what `check` refuses and from
what the probe sandbox's pid 1 reported applying (docs/enforcement-linux.md shows them).
"""

from __future__ import annotations

import os

from stockade.launch.backend import Backend
from stockade.launch.probe import Attestation
from stockade.launch.report import (
    ENFORCED,
    PARTIAL,
    UNAVAILABLE,
    Row,
    accepted,
    containment_row,
    row_maker,
)
from stockade.launch.request import LimitSpec, NetworkSpec
from stockade.linux.limits import MEMFD_WATCH, may_set_memfd_noexec
from stockade.linux.probe import ANY_FACTS, tier_verified, verified

USERNET = ("own network namespace; pasta carries it out, an nftables guard inside refuses "
           "loopback, link-local, metadata, private and the host's own addresses")


def rows(attestation: Attestation, backend: Backend) -> tuple[Row, ...]:
    facts = attestation.facts
    row = row_maker(attestation, verified)
    enforced = attestation.enforced
    limit_how = enforced.get("limits", {})
    abi = facts.get("landlock_abi")
    landlock_tcp = facts.get("tcp_loopback") == "EACCES"
    root = attestation.run_as == "root"
    mounts = ("read_root_read_only", "outside_path")
    landlock = ("landlock_ungranted_dir",)
    isolated = ("new_namespaces", "network_interfaces", "host_listeners_untouched")
    teardown = ("daemon_started", "leftover_processes")
    return (
        row("namespaces", "user, mnt, pid, ipc, uts, net and cgroup namespaces",
            {"namespaces": ("new_namespaces",)},
            "ids mapped one to one" if not root else "uid 0 mapped to itself"),
        row("privileges", "every capability set emptied, securebits locked, no_new_privs",
            {"privileges": ("no_new_privs", "capabilities", "securebits")},
            partial="run as root, uid 0 still owns root's files: root-owned files in write "
                    "roots are writable and root-owned sockets in granted roots reachable"
            if root else ""),
        row("landlock", "Landlock (not observed)" if abi is None
            else f"Landlock ABI {abi}: {_landlock_rights(enforced)}",
            {"landlock": landlock + ("landlock_abi",)},
            "an independent second layer over the same roots"),
        row("seccomp", _seccomp_mechanism(attestation),
            {"seccomp": ("seccomp_mode", "seccomp_unshare")}),
        row("filesystem.read", "a fresh root holding the read roots, bind-mounted read-only "
            "(nosuid, nodev); Landlock read rights beneath them",
            {"mounts": mounts, "landlock": landlock},
            "outside the roots is absent (mounts) and denied (Landlock)"),
        row("filesystem.write", "write roots bind-mounted nosuid, nodev; Landlock write rights "
            "beneath them only", {"mounts": ("write_root", "outside_path"), "landlock": landlock}),
        row("filesystem.deny", "an inaccessible (mode 000) read-only mask mounted over the path, "
            "the directories above it in a write root pinned (no rename carries it away)",
            {"mounts": ("denied_path",)},
            "mount layer only: Landlock cannot carve an exception out of a granted root"),
        row("filesystem.protected", "each occurrence inside a write root re-mounted read-only, "
            "the directories above it pinned; a new one refused: pid 1 makes every name the "
            "command makes (seccomp user notification) and none protected",
            {"mounts": ("protected_name",)},
            partial="a unix socket bound at a protected name is made; without seccomp user "
                    "notification a name created during the run is writable"),
        row("filesystem.git", "in each repository in a write root, its config and what that "
            "includes, its hooks and its gitdir pointers re-mounted read-only (made empty in "
            "the gitdir where missing), the directories above them pinned; the rest of .git "
            "writable", {"mounts": ("git_hooks", "git_metadata")},
            partial="only what exists at launch: a repository the command creates, or a "
                    "commondir it adds to a gitdir without one, is its own, and git on the host "
                    "reads it there (the writable index can make it a submodule git status "
                    "enters)"),
        row("filesystem.exec_from_write", "write roots mounted noexec; Landlock withholds "
            "EXECUTE in them", {"mounts": ("write_root_noexec",), "landlock": landlock}),
        row("filesystem.metadata", "outside the roots is absent; read roots, protected names "
            "and guarded repository files are read-only mounts: their mode and times cannot "
            "change", {"mounts": mounts + ("protected_name",)},
            "mounts only: Landlock does not govern chmod or utime"),
        _memfd_row(facts),
        row("filesystem.privilege_bits", "seccomp: no setuid or setgid mode bit by chmod, "
            "open or mknod (openat2 answers ENOSYS); no CAP_SETFCAP for file capabilities",
            {"seccomp": ("privilege_bits",)}, "nothing made in a write root is setuid on the "
                                              "host"),
        _workspace_row(root),
        row("stockade_state", "Stockade's state directories (ledger, attestations, daemon and "
            "CLI server sockets, seal key) and the private homes' directory beside the seal "
            "key's masked in every view (a run sees its own home there alone), the directories "
            "above them in a write root pinned; its servers serve no peer in another context",
            {"mounts": ("stockade_state",)},
            "servers know a peer by SO_PEERPIDFD and its own /proc, never by what it says"),
        row("network.none", "a network namespace of its own, holding only its own loopback",
            {"namespace": isolated}),
        row("network.tcp", "own network namespace" + (", Landlock TCP connect and bind rules"
                                                       if landlock_tcp else ""),
            {"namespace": isolated + ("tcp_loopback",)}),
        row("network.udp", "own network namespace (Landlock has no UDP rules)",
            {"namespace": isolated}, "datagrams reach only the sandbox's own loopback"),
        row("network.dns", "own network namespace: no resolver is reachable",
            {"namespace": isolated + ("dns",)}),
        row("network.loopback", "own network namespace: its loopback is not the host's",
            {"namespace": isolated}, "host services on 127.0.0.1 are unreachable"),
        row("network.link_local", "own network namespace: no route to link-local or metadata "
            "addresses", {"namespace": isolated + ("link_local",)}),
        row("network.unix_sockets", "abstract sockets are per network namespace"
            + (", Landlock scopes them (ABI 6+)" if (abi or 0) >= 6 else "")
            + "; socket files in write roots, and host sockets listening in any root, at "
            "launch masked (unix_sockets = own)",
            {"namespace": isolated + ("unix_abstract",), "mounts": ("unix_socket_file",)},
            partial="a socket the host binds during the run, or one its network namespace "
                    "does not list, stays connectable: neither mounts nor Landlock (ABI 7) "
                    "govern connect() on it"),
        row("network.address_families", "seccomp: sockets of unix, inet, inet6 and netlink "
            "only (AF_VSOCK, AF_ALG, AF_PACKET, ... EAFNOSUPPORT)",
            {"seccomp": ("socket_vsock",)}, "what a network namespace does not isolate"),
        row("network.inherited_sockets", "every descriptor but stdin, stdout and stderr is "
            "closed before exec", {"descriptors": ("inherited_fds",)}),
        accepted(backend, "network.allowlist", NetworkSpec("allowlist", ("example.com",)), "",
                 row("network.allowlist", "own network namespace; Stockade's proxy is the only "
                     "way out (HTTP CONNECT, plain HTTP, SOCKS5; no UDP)",
                     {"namespace": isolated},
                     "domain rules are applied by the proxy; the probe verifies the isolation")),
        accepted(backend, "network.any", NetworkSpec("any"), USERNET,
                 Row("network.any", ENFORCED, USERNET, "the readiness probe verifies the "
                     "host's loopback and own address out of reach; the guard's ranges beyond "
                     "the host, which a probe could only test by leaving it, are proven by "
                     "`stockade evidence` (net.any-guarded)")
                 if verified(facts, *ANY_FACTS) else None),
        row("env", "a closed environment: only passed or set names; loader-injection and "
            "credential-looking names are refused", {"environment": ("environment",)}),
        row("limits.memory", limit_how.get("memory", "RLIMIT_AS"), {"rlimits": ("rlimit_as",)},
            partial="best-effort: an address-space bound per process, not per tree"),
        row("limits.pids", limit_how.get("pids", "RLIMIT_NPROC"),
            {"rlimits": ("rlimit_nproc", "pid_max")},
            partial="best-effort as root: RLIMIT_NPROC does not bind uid 0, so the pid "
                    "namespace allows up to pids + 300" if root else ""),
        row("limits.file_size", limit_how.get("file_size", "RLIMIT_FSIZE"),
            {"rlimits": ("rlimit_fsize",)}, "hard, per file"),
        accepted(backend, "limits.cpu", LimitSpec(cpu=1.0), "CPU rate"),
        row("limits.timeout", limit_how.get("timeout", "wall clock"), {"teardown": teardown},
            "hard: the whole pid namespace is torn down"),
        Row("limits.output", ENFORCED if "output" in limit_how else UNAVAILABLE,
            limit_how.get("output", "captured bytes per stream"), "hard, enforced by the owner"),
        row("kill_on_close", "the sandbox's pid 1 dies with its owner; its exit kills every "
            "process in the pid namespace", {"teardown": teardown},
            "daemonised, double-forked descendants included"),
        row("nested_namespaces", "seccomp: unshare, setns and clone with namespace flags fail "
            "with EPERM, clone3 with ENOSYS", {"seccomp": ("seccomp_unshare",)}),
        row("host_processes", "a pid namespace of its own, with a fresh /proc: no host process "
            "can be seen, signalled or opened", {"namespaces": ("new_namespaces",)}),
        row("ptrace", "seccomp denies ptrace and process_vm_*; host processes are outside the "
            "pid namespace", {"seccomp": ("seccomp_ptrace",)}),
        row("tty_injection", "seccomp denies TIOCSTI and TIOCLINUX; a new session without a "
            "controlling terminal", {"seccomp": ("seccomp_tiocsti",)}),
        containment_row(),
    )


def tier_rows(attestation: Attestation, backend: Backend) -> tuple[Row, ...]:
    """The landlock tier (`isolation = "landlock"`): what it enforces, each row from the facts
    its probe verified, and what it does not enforce, said row by row."""
    row = row_maker(attestation, tier_verified)
    landlock = ("landlock_ungranted_dir", "landlock_abi")
    sockets = ("tcp_loopback", "udp_loopback", "dns", "host_listeners_untouched")
    teardown = ("daemon_started", "leftover_processes")
    carved = "Landlock rules only (no mount view): a directory on the way to one accepts no " \
             "new entry, and loses none"
    return (
        row("isolation", "the landlock tier: no namespace; Landlock, seccomp, rlimits and a "
            "keeper that kills the tree", {"landlock": landlock},
            partial="host processes are visible in /proc (their memory, environment and "
                    "descriptors are not: Landlock), the hostname, IPC objects and cgroup "
                    "are the host's"),
        row("privileges", "every capability set emptied, no_new_privs",
            {"privileges": ("no_new_privs", "capabilities")},
            "" if os.geteuid() == 0 else "the bounding set stays full (shrinking it needs "
            "CAP_SETPCAP); no_new_privs keeps an exec from gaining any capability"),
        row("landlock", f"Landlock ABI {attestation.facts.get('landlock_abi')}: the roots, "
            "carved around protected and denied paths; TCP bind and connect denied; "
            "abstract unix sockets and signals scoped", {"landlock": landlock}),
        row("seccomp", _seccomp_mechanism(attestation) + "; no unix, inet, inet6 or netlink "
            "socket", {"seccomp": ("seccomp_mode", "seccomp_unshare")}),
        row("filesystem.read", "Landlock read rights beneath the read roots",
            {"landlock": landlock + ("outside_read",)},
            partial="one layer: no mount view, so a path outside the roots can be looked up "
                    "(stat), though not opened nor watched (inotify is ENOSYS, in the roots "
                    "too)"),
        row("filesystem.write", "Landlock write rights beneath the write roots",
            {"landlock": ("write_root", "outside_read")}, "one layer (Landlock)"),
        row("filesystem.deny", "carved out of every root: no right beneath the path",
            {"landlock": ("denied_path",)}, partial=carved),
        row("filesystem.protected", "carved out of the write roots: read rights only",
            {"landlock": ("protected_name",)},
            partial=carved + "; a name created during the run is not refused"),
        row("filesystem.git", "each repository's guarded files carved out of the write roots: "
            "read rights only", {"landlock": ("git_hooks",)},
            partial=carved + "; so git cannot make files at the top of a guarded .git "
                             "(commits fail)"),
        row("filesystem.exec_from_write", "Landlock withholds EXECUTE in the write roots",
            {"landlock": landlock}, partial="execve only: no noexec mount and no exec watch, "
            "so a file written there can still be run through ld.so or mapped executable "
            "(mmap, mprotect)"),
        Row("filesystem.metadata", UNAVAILABLE, "none: Landlock does not govern chmod or "
            "utime", "the mode and times of any file the user owns can be changed, outside "
            "the roots too (seccomp refuses set-user-id and set-group-id bits, a mode that "
            "lets other users write, and every extended attribute set or removed)"),
        Row("filesystem.memfd_exec", UNAVAILABLE, "vm.memfd_noexec is the host's",
            "a memfd the command writes can be executed"),
        row("filesystem.privilege_bits", "seccomp: no setuid or setgid mode bit",
            {"seccomp": ("privilege_bits",)}),
        Row("filesystem.workspace", UNAVAILABLE, "none: no mount namespace to overlay the "
            "workspace in", 'filesystem.workspace = "overlay" is refused: the command writes '
            "the real workspace (\"direct\")"),
        row("stockade_state", "a root that holds a state directory of Stockade's (or the "
            "private homes' directory) is refused "
            "(and each is carved out of every root); no AF_UNIX socket, so no Stockade socket "
            "is reachable; its servers refuse a peer with this seccomp filter and no_new_privs; "
            "no extended attribute can be set and no mode can let other users write",
            {"landlock": ("stockade_state",)}),
        row("network.none", "seccomp: no inet, inet6 or netlink socket; Landlock TCP rules",
            {"seccomp": sockets}, "the host's network namespace is shared, unreachable"),
        row("network.tcp", "seccomp (no inet sockets) and Landlock TCP bind/connect",
            {"seccomp": sockets}),
        row("network.udp", "seccomp: no inet sockets", {"seccomp": sockets}),
        row("network.dns", "seccomp: no inet sockets, no resolver reachable",
            {"seccomp": sockets}),
        row("network.loopback", "seccomp: no inet sockets; the host's loopback is unreachable",
            {"seccomp": sockets}),
        row("network.link_local", "seccomp: no inet sockets", {"seccomp": ("link_local",)}),
        row("network.unix_sockets", "seccomp: no AF_UNIX socket at all (socketpair works); "
            "Landlock scopes abstract sockets", {"seccomp": ("unix_abstract",
                                                             "unix_socket_file")},
            partial="stricter than unix_sockets own: the command cannot make unix sockets of "
                    "its own either"),
        row("network.address_families", "seccomp: socketpair(AF_UNIX) only",
            {"seccomp": ("socket_vsock",)}),
        row("network.inherited_sockets", "every descriptor but stdin, stdout and stderr is "
            "closed before exec", {"descriptors": ("inherited_fds",)}),
        accepted(backend, "network.allowlist", NetworkSpec("allowlist", ("example.com",)), ""),
        accepted(backend, "network.any", NetworkSpec("any"), USERNET),
        row("env", "a closed environment", {"environment": ("environment",)}),
        row("limits.memory", "RLIMIT_AS", {"rlimits": ("rlimit_as",)},
            partial="an address-space bound per process, not per tree; refusals not reported"),
        accepted(backend, "limits.pids", LimitSpec(pids=64), "", row(
            "limits.pids", "RLIMIT_NPROC: the user's tasks at launch plus pids",
            {"rlimits": ("rlimit_nproc",)},
            partial="RLIMIT_NPROC counts every process of the user, not the tree's")),
        row("limits.file_size", "RLIMIT_FSIZE", {"rlimits": ("rlimit_fsize",)}, "hard, per file"),
        accepted(backend, "limits.cpu", LimitSpec(cpu=1.0), "CPU rate"),
        row("limits.timeout", "wall clock; the keeper kills every descendant",
            {"teardown": teardown}),
        Row("limits.output", ENFORCED, "captured bytes per stream",
            "hard, enforced by the owner"),
        row("kill_on_close", "the keeper is the tree's child subreaper: when the command exits "
            "or the owner goes, every descendant (pinned by a pidfd) is killed",
            {"teardown": teardown}, partial="a host process that kills the keeper itself "
                                            "leaves the command's grandchildren running"),
        row("nested_namespaces", "seccomp: unshare, setns and clone with namespace flags fail",
            {"seccomp": ("seccomp_unshare",)}),
        row("process_control", "seccomp: no resource limit, priority, affinity, scheduling, "
            "I/O priority or memory placement of any process but the caller's own (pid 0), "
            "the keeper's and the host's included; kcmp and process_mrelease refused",
            {"seccomp": ("seccomp_mode",)}, "the command's own children are refused too: "
            "a filter cannot tell them from the host's"),
        Row("host_processes", UNAVAILABLE, "no pid namespace: the host's /proc",
            "host processes are visible (command lines, status, descriptor numbers) and a "
            "pidfd can be taken on them; Landlock keeps their memory, environment and "
            "descriptors out of reach and scopes signals"),
        Row("stdio", ENFORCED if attestation.ready else UNAVAILABLE,
            "pipes relayed by the owner", "no terminal or file of the caller's enters the "
            "sandbox" if attestation.ready else "not verified: the readiness probe failed"),
        row("ptrace", "seccomp denies ptrace and process_vm_*; Landlock keeps processes "
            "outside the domain out of reach", {"seccomp": ("seccomp_ptrace",)}),
        row("signals", "Landlock scopes signals to the sandbox's own processes",
            {"landlock": landlock}),
        row("tty_injection", "seccomp denies TIOCSTI and TIOCLINUX; a new session",
            {"seccomp": ("seccomp_tiocsti",)}),
    )


def _workspace_row(root: bool) -> Row:
    """The copy-on-write workspace: made at launch when a policy asks for it (the readiness
    probe does not), so never more than partial; its limits are SECURITY.md's."""
    return Row("filesystem.workspace", PARTIAL, 'workspace = "overlay": each write root an '
               "overlayfs made in the sandbox's user namespace (nosuid, nodev, noexec as the "
               "root), its upper layer a change set in the state directory until `stockade "
               "apply`; protected names, deny masks and the exec rules hold inside it",
               "not verified by the readiness probe (a kernel that cannot make it refuses the "
               "launch, typed); mounts below a write root do not show through it"
               + ("" if root else "; rootless, files owned by ids not mapped in the sandbox "
                  "cannot be changed (EOVERFLOW)"))


def _memfd_row(facts: dict) -> Row:
    """Executing written memory: pid 1's memfd seal and exec watch (memwatch.c), and as
    host root vm.memfd_noexec."""
    mechanism = MEMFD_WATCH + (" + vm.memfd_noexec = 2 in the sandbox's pid namespace"
                               if may_set_memfd_noexec() else "")
    if facts.get("memfd_exec") == "EACCES":
        return Row("filesystem.memfd_exec", ENFORCED, mechanism)
    return Row("filesystem.memfd_exec", UNAVAILABLE, mechanism,
               "a memfd the command writes can be executed" if facts.get("memfd_exec") == "ok"
               else "not verified")


def _landlock_rights(enforced: dict) -> str:
    groups = enforced.get("landlock", {})
    return ", ".join(name.replace("_", " ") for name, on in groups.items()
                     if on is True) or "none"


def _seccomp_mechanism(attestation: Attestation) -> str:
    denied = attestation.enforced.get("seccomp", {}).get("denied_syscalls", "?")
    return (f"libseccomp {attestation.versions.get('libseccomp')} filter: {denied} system "
            "calls denied, clone3 answers ENOSYS, TIOCSTI/TIOCLINUX denied, foreign "
            "architectures killed")
