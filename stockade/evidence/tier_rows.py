"""The evidence matrix in the landlock tier (`stockade evidence --isolation landlock`): each row
of rows.py as that tier meets it (the VM rows attack a guest, not a tier, and are left out).

With no namespace, what refuses an attack is a Landlock rule (the roots, with protected and
denied paths carved out), a seccomp rule (no unix or internet sockets), a limit or the keeper
(stockade/linux/landlock_tier.py); a row names those mechanisms and the tier's switches that
prove them (`TIER_LAYERS`: the ones the tier honours). Where the tier does not enforce what a row
attacks, the row is `NotEnforced`: its attack runs and must work there, or the policy must be
refused, typed; and it names the row of the tier's enforcement report (`stockade report`) that
says so. Every row names its report row (`capability`): tests/test_evidence.py checks that the
two agree, row for row.

What differs from a row's own is spelled out below; an attack's arguments change only where the
tier has no such place (a private /tmp, a UTS namespace of its own).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from stockade.evidence.judges import Bounded, NotEnforced, RefusedBefore, refused_by
from stockade.evidence.launches import Soak
from stockade.evidence.row import Mutation, Row, off, without
from stockade.evidence.rows import FORK_LIMIT, HOST_CODE_REFUSED, ROWS, SERVED, denied, knob

ISOLATION = "landlock"
# The switches of frame.LAYERS the tier honours (LinuxBackend(weaken=...).tier("landlock")).
TIER_LAYERS = frozenset({
    "landlock", "seccomp", "privileges", "deny", "deny_links", "protected", "rlimits", "network",
    "unix_sockets", "stockade_state", "host_code", "environment", "lifeline", "tree_kill",
    "timeout", "output_cap", "stdio_relay", "peer_check", "server_check",
    "change_store_check", "change_seal", "change_seal_key", "pid_scope", "xattr", "world_write",
    "inotify",
})
LANDLOCK = refused_by("landlock", "EACCES")
CARVED_PROTECTED = refused_by("protected", "EACCES")  # a Landlock rule carved around it
CARVED_DENY = refused_by("deny", "EACCES")
NO_INET = refused_by("network", "EACCES")  # seccomp: no inet, inet6 or netlink socket
NO_UNIX = refused_by("unix_sockets", "EACCES")  # seccomp: no AF_UNIX socket
PID_SCOPE = refused_by("pid_scope", "EPERM")  # seccomp: no other process by pid
SHARED_MOUNTS = ("the tier shares the host's mount namespace: switched off, its layers would "
                 "let the attack mount on the host itself")
STATE_REFUSED = "unenforceable:filesystem.stockade_state"
HOLDS_STATE = ("the root (/, the home directory) holds Stockade's state directory, so the tier "
               "refuses it first; with that refusal off, the denied paths' carve-out holds "
               "(fs.deny-in-root proves it)")
KEEPER_UNDUMPABLE = ("the keeper is not dumpable and makes no name for the command: the "
                     "kernel's own check of who may open its /proc/<pid> files refuses, which "
                     "no switch of the tier's turns off")
KEEPER_CLOSES = ("the keeper closes every descriptor but its own before it reads the launch "
                 "(and with it the switches), and the command closes them again: no switch of "
                 "the tier's reaches both")


@dataclass(frozen=True)
class Tier:
    """How a row runs in the tier: the report row it attests, and what differs from its own."""

    capability: str
    changes: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


# The tier's pids limit is RLIMIT_NPROC over the user's tasks at launch plus pids: each other
# process of the user that ends during the attack frees a slot for it (a test suite running
# beside as the same user ends many). Without the limit the bomb reaches its own cap (600).
NPROC_SLACK = 16


def tier(capability: str, **changes: Any) -> Tier:
    if isinstance(changes.get("proven_by"), Mutation):
        changes["proven_by"] = (changes["proven_by"],)
    return Tier(capability, MappingProxyType(changes))


def gap(capability: str, refused: str = "", **changes: Any) -> Tier:
    """Not enforced by the tier, as its report's row `capability` says."""
    return tier(capability, expect=NotEnforced(capability, refused), proven_by=(),
                unproven="not enforced by this isolation", control=None,
                uncontrolled="not enforced here: the row's own run shows the attack working",
                root_only="", **changes)


LANDLOCK_ROWS = ("fs.read-outside", "fs.write-outside", "fs.symlink-planted",
                 "fs.symlink-runtime", "fs.proc-root", "fs.proc-fd-reopen",
                 "fs.truncate-read-only", "env.home")
WRITE_ROWS = {"fs.write-outside"}
CARVED_ROWS = {"fs.protected-dir": "filesystem.protected",
               "fs.protected-code-running": "filesystem.protected",
               "fs.protected-file": "filesystem.git",
               "fs.protected-rename": "filesystem.git", "fs.git-pointers": "filesystem.git",
               "fs.protected-bind-alias": "filesystem.protected"}
SECCOMP_ROWS = {"net.address-families": "network.address_families",
                "proc.user-namespace": "nested_namespaces", "proc.clone3": "nested_namespaces",
                "proc.keyctl": "seccomp", "proc.bpf": "seccomp", "proc.perf-event": "seccomp",
                "proc.io-uring": "seccomp"}
UNCHANGED = {"fs.git-absent": "filesystem.git", "fs.deny-in-root": "filesystem.deny",
             "fs.deny-absent": "filesystem.deny", "fs.deny-passwd-home": "filesystem.deny",
             "fs.deny-bind-alias": "filesystem.deny",
             "fs.deny-hard-link-read-root": "filesystem.deny",
             "fs.deny-hard-link-overlay-layer": "filesystem.deny",
             "fs.mount-of-removed-name": "filesystem.read",
             "fs.mount-unlookable": "filesystem.read",
             "fs.overlay-of-denied": "filesystem.deny", "fs.overlay-unjudged": "filesystem.deny",
             "fs.overlay-layer-copy": "filesystem.deny",
             "fs.overlay-shared-layer": "filesystem.deny",
             "fs.overlay-covered-layer": "filesystem.deny",
             "fs.overlay-hidden-layer": "filesystem.deny",
             "fs.overlay-state-upper": "stockade_state",
             "fs.overlay-bind-below-denied": "filesystem.deny",
             "fs.overlay-proc-layer": "filesystem.deny",
             "fs.host-code-overlay-upper": "filesystem.protected",
             "fs.deny-repointable": "filesystem.deny",
             "fs.planted-root-link": "filesystem.write",
             "env.parent-secrets": "env", "env.loader-variables": "env",
             "env.refused-loader": "env", "env.refused-credential": "env",
             "res.memory-bomb": "limits.memory",
             "res.output-flood": "limits.output", "res.output-to-a-file": "stdio",
             "helpers.planted-changes": "stockade_state",
             "helpers.forged-changes": "stockade_state",
             "helpers.forged-state-dir": "stockade_state",
             "fs.host-code-pth-missing": "filesystem.protected",
             "fs.host-code-runtime-site-pth": "filesystem.protected"}
ROW_ARGS = {row.id: row.args for row in ROWS}
# The copy-on-write workspace needs a mount namespace: the tier refuses such a policy, typed.
OVERLAY_ROWS = ("fs.overlay-writes", "fs.overlay-protected", "fs.overlay-deny",
                "fs.overlay-exec", "fs.overlay-exec-via-loader", "fs.overlay-exec-via-mmap",
                "fs.overlay-review")


def _specs() -> dict[str, Tier]:
    root = os.geteuid() == 0
    specs: dict[str, Tier] = {}
    for row_id in LANDLOCK_ROWS:
        capability = "filesystem.read" if row_id not in WRITE_ROWS else "filesystem.write"
        specs[row_id] = tier(capability, expect=denied(LANDLOCK), proven_by=off("landlock"))
    specs["fs.write-read-root"] = tier("filesystem.read", expect=denied(LANDLOCK),
                                       proven_by=off("landlock"))
    for row_id, capability in CARVED_ROWS.items():
        specs[row_id] = tier(capability, expect=denied(CARVED_PROTECTED),
                             proven_by=(off("protected"), off("landlock")))
    # (the carve-out grants the rights on each sibling, never on the directories above a
    # denied path: Landlock refuses their rename, as the pins do in a view)
    specs["fs.mask-rename"] = tier("filesystem.deny", expect=denied(CARVED_DENY),
                                   proven_by=(off("deny"), off("landlock")))
    # (a rule on another name of a denied file holds for the file: that name gets none)
    for row_id in ("fs.deny-hard-link", "fs.deny-link-bind-alias"):
        specs[row_id] = tier("filesystem.deny", expect=denied(
            refused_by("deny_links", "EACCES"), CARVED_DENY), proven_by=off("deny_links"))
    # (rootless, without a user namespace's root, the denied directory cannot be listed for the
    # other names of its files: refused, typed; a rule on the link would grant the file)
    specs["fs.deny-link-unlisted"] = tier("filesystem.deny", expect=denied(
        refused_by("deny_links", "EACCES"), CARVED_DENY) if root else RefusedBefore(
        "unenforceable:filesystem.deny"), proven_by=off("deny_links"))
    for row_id, capability in SECCOMP_ROWS.items():
        specs[row_id] = tier(capability)
    for row_id, capability in UNCHANGED.items():
        specs[row_id] = tier(capability)
    for row_id in OVERLAY_ROWS:
        specs[row_id] = gap("filesystem.workspace", refused="unenforceable:filesystem.workspace")
    specs.update({
        "fs.metadata": gap("filesystem.metadata"),
        # (Landlock does not govern a watch: it needs no right to open what it watches)
        "fs.watch-outside": tier("filesystem.read", expect=denied(refused_by("inotify", "ENOSYS")),
                                 proven_by=off("inotify")),
        # (a file capability is an extended attribute: refused with every other one)
        "fs.privilege-bits": tier("filesystem.privilege_bits", expect=denied(
            refused_by("seccomp", "EPERM"), refused_by("xattr", "ENOTSUP", attempts="setxattr"))),
        **{row_id: tier("filesystem.deny", expect=RefusedBefore(STATE_REFUSED), proven_by=(),
                        unproven=HOLDS_STATE)
           for row_id in ("fs.deny-whole-tree", "env.home-credentials")},
        "fs.protected-create": gap("filesystem.protected"),
        # (fs.host-code-module-as-package: the module file itself, in the workspace, is host
        # code, so the tier refuses it whatever its __path__ is judged to be; so with
        # fs.host-code-dot-dot-link's package, imported through a link into the workspace)
        **{row_id: tier("filesystem.protected", expect=RefusedBefore(HOST_CODE_REFUSED),
                        proven_by=off("host_code"))
           for row_id in ("fs.host-code", "fs.host-code-rename", "fs.host-code-other-name",
                          "fs.host-code-mount-below", "fs.host-code-linked-entry",
                          "fs.host-code-imported-module", "fs.host-code-pycache-prefix",
                          "fs.host-code-editable-mapping", "fs.host-code-start-link",
                          "fs.host-code-shadowing-name", "fs.host-code-prefix-part",
                          "fs.host-code-relative-entry", "fs.host-code-searched",
                          "fs.host-code-working-directory",
                          "fs.host-code-searched-below-start",
                          "fs.host-code-package-path", "fs.host-code-namespace-portion",
                          "fs.host-code-module-as-package",
                          "fs.host-code-finder-held-path",
                          "fs.host-code-relative-next-run",
                          "fs.host-code-dot-dot-link", "fs.host-code-module-origin",
                          "fs.host-code-below-moved-cwd")},
        # (the home holds the place of a rootless user's state directory, whatever the
        # environment says: refused first; with that refusal off, the carve-outs keep the
        # home's code that exists, and a missing name only in a directory that holds a
        # carved path (the home, ~/.config): in a sibling granted whole, ~/.cargo, it is made)
        # (and with it off, the tier's refusal of a root where the home's code could be made,
        # which holds alone too: the row fails with both off)
        "fs.home-code": tier("filesystem.protected",
                             expect=RefusedBefore(STATE_REFUSED, (HOST_CODE_REFUSED,)),
                             proven_by=off("stockade_state", "host_code")),
        "fs.private-home-other": tier("stockade_state",
                                      expect=RefusedBefore(STATE_REFUSED, (HOST_CODE_REFUSED,)),
                                      proven_by=off("stockade_state", "host_code")),
        "fs.hardlink": tier("filesystem.write", expect=denied(
            CARVED_PROTECTED, refused_by("landlock", "EACCES", "EXDEV")),
            proven_by=off("protected")),
        "fs.exec-from-write": tier("filesystem.exec_from_write", args=("direct", "{ws}"),
                                   expect=denied(LANDLOCK), proven_by=off("landlock"),
                                   control=without("landlock")),
        "fs.exec-via-loader": gap("filesystem.exec_from_write", args=("loader", "{ws}")),
        "fs.exec-via-mmap": gap("filesystem.exec_from_write", args=("mmap", "{ws}")),
        "fs.memfd-exec": gap("filesystem.memfd_exec"),
        # (Landlock's rules hold inodes, not names: another spelling reaches the same rule)
        "fs.case-alias": tier("filesystem.protected", expect=denied(CARVED_PROTECTED,
                                                                  CARVED_DENY),
                              proven_by=(off("protected"), off("deny"))),
        "fs.mknod": tier("filesystem.write", args=("{ws}",), expect=denied(
            LANDLOCK, refused_by("privileges", "EPERM")), proven_by=off("landlock", "privileges"),
            unproven="", control=without("landlock", "privileges")),
        "fs.block-device": tier("filesystem.read", expect=denied(LANDLOCK),
                                proven_by=off("landlock")),
        "net.tcp-loopback": tier("network.tcp", expect=denied(NO_INET, LANDLOCK),
                                 proven_by=off("network", "landlock")),
        "net.udp-loopback": tier("network.udp", expect=denied(NO_INET), proven_by=off("network")),
        "net.dns-loopback": tier("network.dns", expect=denied(NO_INET, LANDLOCK),
                                 proven_by=off("network")),
        "net.test-host": tier("network.none", expect=denied(NO_INET, LANDLOCK),
                              proven_by=off("network")),
        "net.listen": tier("network.tcp", expect=denied(NO_INET, LANDLOCK),
                           proven_by=off("network", "landlock")),
        "net.unix-abstract": tier("network.unix_sockets", expect=denied(
            NO_UNIX, refused_by("landlock", "EPERM")), proven_by=off("unix_sockets", "landlock")),
        "net.unix-path": tier("network.unix_sockets", expect=denied(NO_UNIX),
                              proven_by=off("unix_sockets")),
        "net.unix-in-write-root": tier("network.unix_sockets", expect=denied(NO_UNIX),
                                       proven_by=off("unix_sockets")),
        "net.unix-in-read-root": tier("network.unix_sockets", expect=denied(NO_UNIX),
                                      proven_by=off("unix_sockets")),
        "net.inherited-socket": tier("network.inherited_sockets", proven_by=(),
                                     unproven=KEEPER_CLOSES),
        **{row_id: gap("network.any", refused="unenforceable:network.any")
           for row_id in ("net.any-loopback", "net.any-guarded", "net.any-inbound")},
        **{row_id: gap("network.allowlist", refused="unenforceable:network.allowlist")
           for row_id in ("net.allowlist-direct", "net.allowlist-rebind",
                          "net.allowlist-ip-literal", "net.allowlist-metadata",
                          "net.credential-elsewhere", "net.credential-hidden",
                          "net.credential-ca-key", "net.http-framing", "net.http-rules",
                          "net.credential-guarded", "env.credential-secret",
                          "fs.approval-write-outside")},
        "proc.ptrace": tier("ptrace", expect=denied(refused_by("seccomp", "EPERM"),
                                                    refused_by("landlock", "EPERM")),
                            proven_by=off("seccomp")),
        "proc.pid1-descriptors": tier("ptrace", expect=denied(refused_by("kernel", "EACCES")),
                                      proven_by=(), unproven=KEEPER_UNDUMPABLE, control=None,
                                      uncontrolled=KEEPER_UNDUMPABLE),
        "proc.host-visible": gap("host_processes"),
        "proc.control-host": tier("process_control", expect=denied(PID_SCOPE),
                                  proven_by=off("pid_scope")),
        "proc.signal-host": tier("signals", expect=denied(refused_by("landlock", "EPERM")),
                                 proven_by=off("landlock")),
        "proc.tty-injection": tier("tty_injection", expect=denied(
            refused_by("seccomp", "EPERM"), LANDLOCK, refused_by("kernel", "ENXIO", "EIO")),
            proven_by=off("seccomp", "landlock", when=knob("dev/tty/legacy_tiocsti", "1")),
            control=without("seccomp", "landlock")),
        "proc.caller-terminal": tier("stdio", expect=denied(
            refused_by("stdio_relay", "ENOTTY", "EBADF", "ENXIO", "NO_TERMINAL",
                       "NOTHING_READ"), refused_by("landlock", "EACCES", attempts="open"))),
        "proc.setuid": tier("privileges", expect=denied(refused_by("privileges", "UID_KEPT")),
                            proven_by=off("privileges", "landlock") if root  # (each sets
                            else off("privileges", "landlock", "seccomp"),  # no_new_privs)
                            unproven=""),
        "proc.capabilities": tier("privileges", args=("{host_user}", "shared-uts"), expect=denied(
            refused_by("privileges", "EPERM", "NONE_HELD", "SET"),
            refused_by("seccomp", "EAFNOSUPPORT")),
            proven_by=off("privileges") if root else off("privileges", "landlock", "seccomp"),
            control=without("privileges", "seccomp", "landlock")),
        "proc.mount": tier("nested_namespaces", proven_by=(), unproven=SHARED_MOUNTS,
                           control=None, uncontrolled=SHARED_MOUNTS),
        "proc.userfaultfd": tier("seccomp", expect=denied(refused_by("seccomp", "EPERM"),
                                                          LANDLOCK)) if root
        else tier("seccomp", args=("userfaultfd-call",)),
        "proc.dev-mem": tier("filesystem.read", expect=denied(LANDLOCK, refused_by(
            "kernel", "EPERM")), proven_by=off("landlock")),
        "res.fork-bomb": gap("limits.pids", refused="unenforceable:limits.pids") if root
        else tier("limits.pids", expect=Bounded((refused_by("rlimits", "EAGAIN"),),
                                                note="processes",
                                                limit=lambda: FORK_LIMIT + NPROC_SLACK),
                  proven_by=off("rlimits"), control=without("rlimits")),
        "res.disk-fill": tier("limits.file_size", args=(ROW_ARGS["res.disk-fill"][0], "{fill}")),
        "res.cpu-spin": tier("limits.timeout", proven_by=(off("timeout"), off("lifeline"))),
        "life.soak": tier("filesystem.read", expect=Soak((LANDLOCK,)), proven_by=off("landlock")),
        "life.daemon": tier("kill_on_close", proven_by=off("tree_kill"),
                            control=without("tree_kill")),
        # (on the host, the attack would disarm the evidence runner itself: its control runs
        # in the tier without the rules that keep the keeper out of reach, until the timeout)
        "life.keeper": tier("process_control", expect=denied(PID_SCOPE),
                            proven_by=off("pid_scope"),
                            control=without("pid_scope", deadline=6.0)),
        "life.owner-killed": tier("kill_on_close"),
        "life.timeout": tier("limits.timeout", proven_by=(off("timeout"), off("lifeline"))),
        "life.cancel": tier("kill_on_close", proven_by=off("lifeline")),
        # (a root that holds a state directory is refused: Landlock rules only add rights, so
        # nothing could hide it, nor one made there later)
        "helpers.state-dir": tier("stockade_state", expect=RefusedBefore(STATE_REFUSED),
                                  proven_by=off("stockade_state")),
        "helpers.change-set-store": tier("stockade_state", expect=denied(
            refused_by("xattr", "ENOTSUP"), refused_by("world_write", "EPERM")),
            proven_by=(off("xattr"), off("world_write"))),
        "helpers.servers": tier("stockade_state", expect=denied(NO_UNIX, refused_by(
            "peer_check", "PEER_REFUSED", "NOT_SERVED")),
            # (the servers tell a tier process by its seccomp filter, no_new_privs and
            # capabilities: with all of them off, it is a host process like any other)
            proven_by=(off("unix_sockets", "peer_check"),
                       off("seccomp", "privileges", "landlock"))),
        "helpers.served-host-code": tier("filesystem.protected",
                                         expect=RefusedBefore(HOST_CODE_REFUSED), proven_by=(),
                                         unproven=SERVED),
        "helpers.planted-servers": tier("stockade_state", expect=denied(NO_UNIX, refused_by(
            "server_check", "NOTHING_SENT")),
            # (the clients tell a tier process by its seccomp filter, no_new_privs and
            # capabilities, as the servers do)
            proven_by=(off("unix_sockets", "server_check"),
                       off("seccomp", "privileges", "landlock"))),
    })
    return specs



@functools.cache
def landlock_rows() -> tuple[Row, ...]:
    """The matrix's rows as the landlock tier runs them (as root, the presets' limits.pids is
    lifted: the tier refuses it there, and only res.fork-bomb is about it)."""
    specs = _specs()
    rows = []
    for row in ROWS:
        if row.category == "vm":
            continue
        spec = specs[row.id]
        policy: dict[str, Any] = {section: dict(values) for section, values in row.policy.items()}
        if os.geteuid() == 0 and row.id != "res.fork-bomb":
            policy.setdefault("limits", {})["pids"] = "unlimited"
        rows.append(replace(row, isolation=ISOLATION, capability=spec.capability,
                            policy=MappingProxyType(policy), **spec.changes))
    return tuple(rows)


def rows_for(isolation: str) -> tuple[Row, ...]:
    """The matrix of an isolation (policy.model.ISOLATIONS)."""
    return ROWS if isolation == "namespaces" else landlock_rows()
